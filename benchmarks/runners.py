"""Runner benchmark: idemp's runners against the official client's PushConsumers.

One broker (idemp's), one message set (``--count`` messages of ``--body-size`` bytes,
sent once to a 4-queue topic with idemp's batch send), the same no-op listener, four
consumers each in its own group reading from the first offset:
idemp OrderlyRunner vs the official orderly PushConsumer, idemp ConcurrentRunner vs
the official concurrent PushConsumer. Throughput is counted from the first to the last
delivered message (the official orderly consumer idles ~10 s before its first pull;
start-up is not what is compared). Official consumers run in a child process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from idemp.broker.process import BrokerProcess


class _Tally:
    """Deliveries counted from the first to the last: both consumers are timed alike."""

    def __init__(self, count: int) -> None:
        self.count, self.n, self.first, self.last = count, 0, 0.0, 0.0
        self.lock = threading.Lock()
        self.done = threading.Event()

    def seen(self) -> None:
        now = time.monotonic()
        with self.lock:
            if self.n == 0:
                self.first = now
            self.n += 1
            self.last = now
            if self.n >= self.count:
                self.done.set()

    def result(self, ok: bool) -> dict[str, Any]:
        return {"count": self.n, "seconds": self.last - self.first, "ok": ok}


def _child_official(
    namesrv: str, topic: str, group: str, orderly: bool, count: int, threads: int
) -> int:
    from rocketmq.client import ConsumeStatus, PushConsumer

    tally = _Tally(count)

    def cb(msg: Any) -> Any:
        tally.seen()
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(group, orderly=orderly)
    c.set_namesrv_addr(namesrv)
    c.set_thread_count(threads)
    c.subscribe(topic, cb)
    c.start()
    ok = tally.done.wait(600)
    c.shutdown()
    print(json.dumps(tally.result(ok)))
    return 0


def _run_official(
    namesrv: str, topic: str, group: str, orderly: bool, count: int, threads: int, home: str
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.runners",
        "--child",
        namesrv,
        topic,
        group,
        "1" if orderly else "0",
        str(count),
        str(threads),
    ]
    res = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "HOME": home},
        cwd=Path(__file__).resolve().parent.parent,
    )
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"official consumer failed: {res.stderr[-2000:]}")
    return dict(json.loads(lines[-1]))


def _run_idemp(
    namesrv: str, topic: str, group: str, orderly: bool, count: int, threads: int, batch: int
) -> dict[str, Any]:
    from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings
    from idemp.message import Message
    from idemp.runners import ConcurrentRunner, OrderlyRunner

    tally = _Tally(count)

    def listener(msg: Message) -> None:
        tally.seen()

    settings = ConsumerSettings(
        group=group,
        consume_from=ConsumeFrom.FIRST_OFFSET,
        consume_thread_count=threads,
        consume_batch_size=batch,
    )
    cls = OrderlyRunner if orderly else ConcurrentRunner
    runner = cls(listener, settings=settings, client=ClientSettings(namesrv_addr=namesrv))
    runner.subscribe(topic)
    runner.start()
    ok = tally.done.wait(600)
    runner.shutdown()
    return tally.result(ok)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--child":
        a = argv[1:]
        return _child_official(a[0], a[1], a[2], a[3] == "1", int(a[4]), int(a[5]))
    ap = argparse.ArgumentParser(prog="python -m benchmarks runners", description=__doc__)
    ap.add_argument("--count", type=int, default=25_000)
    ap.add_argument("--body-size", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument(
        "--batch",
        type=int,
        default=32,
        help="idemp consume_batch_size (messages per thread hop / per lock)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="idemp and official alternate this many times per runner; the median "
        "ratio is reported (one round is at the mercy of whatever else the 2 cores do)",
    )
    args = ap.parse_args(argv)
    from idemp.client import OutMessage, Producer

    with tempfile.TemporaryDirectory(prefix="idemp-bench-runners-") as tmp:
        broker = BrokerProcess(Path(tmp) / "store").start()
        try:
            topic = "BenchRunners"
            t0 = time.monotonic()
            with Producer(broker.namesrv_addr, "bench-producer") as p:
                body = b"x" * args.body_size
                for i in range(0, args.count, 64):
                    p.send_batch(
                        [
                            OutMessage(topic, body, keys=[f"k{j}"])
                            for j in range(i, min(args.count, i + 64))
                        ]
                    )
            print(f"sent {args.count} x {args.body_size} B in {time.monotonic() - t0:.1f}s")
            rows = []
            for rnd in range(1, args.rounds + 1):
                for mode in ("orderly", "concurrent"):
                    orderly = mode == "orderly"
                    ours = _run_idemp(
                        broker.namesrv_addr,
                        topic,
                        f"idemp-{mode}-{rnd}",
                        orderly,
                        args.count,
                        args.threads,
                        args.batch,
                    )
                    theirs = _run_official(
                        broker.namesrv_addr,
                        topic,
                        f"official-{mode}-{rnd}",
                        orderly,
                        args.count,
                        args.threads,
                        tmp,
                    )
                    for r in (ours, theirs):
                        if r["count"] < args.count:
                            raise RuntimeError(
                                f"{mode}: only {r['count']} of {args.count} consumed"
                            )
                    rate_o = ours["count"] / max(ours["seconds"], 1e-6)
                    rate_t = theirs["count"] / max(theirs["seconds"], 1e-6)
                    rows.append((rnd, mode, rate_o, rate_t))
                    print(
                        f"round {rnd} {mode}: idemp {rate_o:,.0f} msg/s, official "
                        f"{rate_t:,.0f} msg/s, ratio {rate_o / rate_t:.2f}",
                        flush=True,
                    )
        finally:
            broker.stop()
    print(
        f"\n{args.count} messages of {args.body_size} B, {args.threads} threads, "
        f"idemp batch {args.batch}, no-op listener, idemp's broker, {args.rounds} rounds, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'runner':<12}{'idemp msg/s':>14}{'official msg/s':>16}{'median ratio':>14}")
    for mode in ("orderly", "concurrent"):
        mine = [r for r in rows if r[1] == mode]
        ours_rate = statistics.median(r[2] for r in mine)
        theirs_rate = statistics.median(r[3] for r in mine)
        ratio = statistics.median(r[2] / r[3] for r in mine)
        print(f"{mode:<12}{ours_rate:>14,.0f}{theirs_rate:>16,.0f}{ratio:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
