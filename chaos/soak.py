"""The soak run: ``python -m chaos.soak [--minutes 30] [--rate 100]`` (``make soak``).

Steady produce/consume with the decorators on, for a bounded time, to catch what only
shows over hours: memory that grows with the messages seen, file descriptors that leak,
latency that creeps. idemp's broker, PostgreSQL and Redis run on free loopback ports; one
consumer process (``chaos.soak_worker``) runs a concurrent runner (unique-key table on
PostgreSQL, transactional, purged as it goes) and an orderly runner (Redis flag); the
producer sends at a fixed rate (100 msg/s by default: steady, well below what the
consumer can take), 1 % of the messages twice (same key, new msgId).

Every window (10 s) the run samples the broker's and the consumer's RSS and open file
descriptors, and the consumer's end-to-end latency percentiles. The first part of the run
(``--warmup``, default a fifth, at least 60 s) is excluded: caches, pools and the
interpreter's arenas fill there. The rest is split in thirds and judged, first third
against last:

* RSS (broker, consumer): median of the last third ≤ median of the first + 16 MB
  (a leak of ~200 bytes per message would show in a 30-minute run at 100 msg/s); the
  broker may also grow by its consume-queue index, 28 bytes per message stored (an
  in-memory array by design);
* file descriptors: the last third's maximum ≤ the first third's maximum + 4;
* latency: median of the windows' p99 in the last third ≤ 2 × the first third's + 25 ms,
  over the windows where the machine was not oversubscribed (1-minute load ≤ twice the
  cores; fewer than 3 such windows in a third fails as "not judged");
* and, at the end, from the business table: every key applied exactly once, no stream
  event applied out of order.

One line of figures, the windows as JSON lines (``--out``), exit 0 only when all hold.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa

from chaos.app import EFFECTS, create_schema
from chaos.run import Worker, exit_on_sigterm
from chaos.soak_worker import PAY_TOPIC, SEQ_TOPIC, open_fds, rss_kb

RSS_BOUND_MB = 16.0
INDEX_BYTES = 28  # the broker's consume-queue entry: 4 arrays of 8+4+8+8 bytes
FD_BOUND = 4
P99_FACTOR, P99_SLACK_MS = 2.0, 25.0
STREAMS = 64
DRAIN_S = 180.0  # after the last send, the consumer must catch up within this bound
POLL_S = 0.5


@dataclass
class SoakFigures:
    minutes: float
    rate: float
    sent: int = 0
    sent_by_topic: dict[str, int] = field(default_factory=dict)
    duplicates_sent: int = 0
    effects: int = 0
    doubled: int = 0
    lost: int = 0
    order_violations: int = 0
    drained: bool = False
    windows: list[dict[str, Any]] = field(default_factory=list)
    judged: dict[str, dict[str, float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.drained
            and self.doubled == 0
            and self.lost == 0
            and self.order_violations == 0
            and not self.failures
        )

    def line(self) -> str:
        j = self.judged
        parts = [
            f"soak {'OK' if self.ok else 'FAILED'}: {self.minutes:g} min at "
            f"{self.rate:g} msg/s, messages {self.sent} (+{self.duplicates_sent} "
            f"producer duplicates), effects {self.effects}, doubled {self.doubled}, "
            f"lost {self.lost}, order violations {self.order_violations}"
        ]
        for name in ("broker_rss_mb", "consumer_rss_mb", "broker_fds", "consumer_fds", "p99_ms"):
            if name in j:
                parts.append(f"{name} {j[name]['first']:.1f}->{j[name]['last']:.1f}")
        parts.append(f"wall {self.wall_s:.0f}s")
        return ", ".join(parts)


class _Tail:
    """The consumer's window lines as they are appended: each window reads only what is
    new (the file grows for the whole run), and a line still being written waits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: IO[str] | None = None

    def new_lines(self) -> list[dict[str, Any]]:
        if self.file is None:
            if not self.path.exists():
                return []  # the consumer opens it after its first window
            self.file = open(self.path, encoding="utf-8")
        out: list[dict[str, Any]] = []
        while True:
            pos = self.file.tell()
            line = self.file.readline()
            if not line.endswith("\n"):
                self.file.seek(pos)
                return out
            out.append(json.loads(line))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def duplicated(i: int) -> bool:
    """Which messages of a lane the producer sends twice (1 %)."""
    return i % 100 == 37


class SteadyProducer:
    """Two paced lanes (payments, stream events); 1 % of messages sent twice."""

    def __init__(self, namesrv: str, rate: float, until: float) -> None:
        from idemp.client import ClientSettings, OutMessage, Producer

        self._out = OutMessage
        self.producer = Producer(
            namesrv, "soak-producer", client=ClientSettings(namesrv_addr=namesrv)
        ).start()
        self.rate, self.until = rate, until
        self.sent = {PAY_TOPIC: 0, SEQ_TOPIC: 0}
        self.duplicated = {PAY_TOPIC: 0, SEQ_TOPIC: 0}  # one counter per lane thread
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._lane, args=(t,), daemon=True, name=f"soak-{t}")
            for t in (PAY_TOPIC, SEQ_TOPIC)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)

    def _lane(self, topic: str) -> None:
        period = 2.0 / self.rate
        t0 = time.monotonic()
        i = 0
        try:
            while time.monotonic() < self.until:
                ahead = t0 + i * period - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)  # pacing, not synchronisation
                self._send(topic, i)
                if duplicated(i):  # a producer retry: same key, new msgId
                    self._send(topic, i)
                    self.duplicated[topic] += 1
                i += 1
                self.sent[topic] = i
        except BaseException as exc:  # reported by the main loop
            self.errors.append(exc)

    def _send(self, topic: str, i: int) -> None:
        if topic == PAY_TOPIC:
            key = f"pay-{i}"
            self.producer.send(self._out(topic, json.dumps({"id": key}).encode(), keys=[key]))
        else:
            stream, n = f"stream-{i % STREAMS}", i // STREAMS
            body = json.dumps({"stream": stream, "n": n}).encode()
            self.producer.send_orderly(self._out(topic, body, keys=[f"{stream}#{n}"]), stream)

    def shutdown(self) -> None:
        self.producer.shutdown()


def judge(
    windows: list[dict[str, Any]], warmup_s: float, started: float, *, max_load: float | None = None
) -> tuple[dict[str, dict[str, float]], list[str]]:
    """First third against last third of the windows after the warm-up.

    The broker's allowance grows with the messages stored: its consume-queue index is an
    in-memory array of 28 bytes per message by design (RocketMQ maps files instead).
    Latency is judged on the windows where the machine was not oversubscribed (1-minute
    load ≤ ``max_load``, default twice the cores): on a shared machine a burst of
    someone else's work says nothing about the consumer. Too few such windows is a
    failure to judge, never a pass."""
    steady = [w for w in windows if w["t"] - started >= warmup_s]
    if len(steady) < 3:
        return {}, [f"only {len(steady)} windows after the warm-up: too short to judge"]
    third = len(steady) // 3
    first, last = steady[:third], steady[-third:]
    judged: dict[str, dict[str, float]] = {}
    failures: list[str] = []
    stored = statistics.median(w["stored"] for w in last) - statistics.median(
        w["stored"] for w in first
    )
    for name, allowance in (
        ("broker_rss_mb", stored * INDEX_BYTES / 2**20),
        ("consumer_rss_mb", 0.0),
    ):
        a = statistics.median(w[name] for w in first)
        b = statistics.median(w[name] for w in last)
        bound = a + RSS_BOUND_MB + allowance
        judged[name] = {"first": a, "last": b, "bound": bound}
        if b > bound:
            failures.append(f"{name} grew {a:.1f} -> {b:.1f} MB (bound {bound:.1f} MB)")
    for name in ("broker_fds", "consumer_fds"):
        a, b = max(w[name] for w in first), max(w[name] for w in last)
        judged[name] = {"first": a, "last": b, "bound": a + FD_BOUND}
        if b > a + FD_BOUND:
            failures.append(f"{name} grew {a} -> {b} (bound +{FD_BOUND})")
    limit = max_load if max_load is not None else 2.0 * (os.cpu_count() or 1)
    calm_first = [w["p99"] for w in first if w["load1"] <= limit]
    calm_last = [w["p99"] for w in last if w["load1"] <= limit]
    if min(len(calm_first), len(calm_last)) < 3:
        failures.append(
            f"p99 latency not judged: the machine's 1-minute load was above {limit:g} in "
            f"{len(first) - len(calm_first)} of {len(first)} windows of the first third and "
            f"{len(last) - len(calm_last)} of {len(last)} of the last"
        )
        return judged, failures
    a, b = statistics.median(calm_first), statistics.median(calm_last)
    bound = P99_FACTOR * a + P99_SLACK_MS
    judged["p99_ms"] = {
        "first": a,
        "last": b,
        "bound": bound,
        "windows": float(len(calm_first) + len(calm_last)),
    }
    if b > bound:
        failures.append(f"p99 latency rose {a:.1f} -> {b:.1f} ms (bound {bound:.1f} ms)")
    return judged, failures


def verdict(engine: sa.Engine, sent: dict[str, int], figures: SoakFigures) -> None:
    """Exactly once and in order, read from the business table with SQL aggregates."""
    e = EFFECTS.c
    with engine.connect() as conn:
        figures.effects = conn.execute(sa.select(sa.func.count()).select_from(EFFECTS)).scalar_one()
        per_key = sa.select(e.key, sa.func.count().label("c")).group_by(e.key).subquery()
        figures.doubled = int(
            conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(per_key.c.c - 1), 0)).where(per_key.c.c > 1)
            ).scalar_one()
        )
        lost = 0
        for topic, n in sent.items():
            distinct = conn.execute(
                sa.select(sa.func.count(sa.distinct(e.key))).where(e.topic == topic)
            ).scalar_one()
            lost += n - distinct
        figures.lost = lost
        figures.order_violations = conn.execute(
            sa.select(sa.func.count())
            .select_from(EFFECTS)
            .where(e.topic == SEQ_TOPIC, e.gap.is_(True))
        ).scalar_one()


def run(
    minutes: float,
    *,
    rate: float,
    workdir: Path,
    window_s: float = 10.0,
    warmup_s: float | None = None,
    say: Callable[[str], None] = print,
) -> SoakFigures:
    from idemp.broker.process import BrokerProcess
    from tests.servers import PostgresServer, RedisServer

    started = time.monotonic()
    wall0 = time.time()
    duration = minutes * 60.0
    warmup = warmup_s if warmup_s is not None else max(60.0, duration / 5)
    figures = SoakFigures(minutes, rate)
    (workdir / "redis").mkdir(parents=True, exist_ok=True)
    redis = RedisServer(workdir=workdir / "redis")
    pg = PostgresServer()
    broker = BrokerProcess(workdir / "broker-store")
    worker: Worker | None = None
    producer: SteadyProducer | None = None
    tail: _Tail | None = None
    stats = workdir / "consumer-windows.jsonl"
    try:
        redis.start()
        pg.start()
        broker.start()
        create_schema(pg.url)
        engine = sa.create_engine(pg.url)
        cmd = [
            sys.executable,
            "-m",
            "chaos.soak_worker",
            "--namesrv",
            broker.namesrv_addr,
            "--pg",
            pg.url,
            "--redis",
            redis.url,
            "--stats",
            str(stats),
            "--window",
            str(window_s),
        ]
        # Sending first creates the topics, so the consumer finds their routes at once
        # (a consumer of a topic that does not exist yet waits for its route refresh).
        producer = SteadyProducer(broker.namesrv_addr, rate, time.monotonic() + duration)
        producer.start()
        give_up = time.monotonic() + 60.0
        while min(producer.sent.values()) == 0 and not producer.errors:
            if time.monotonic() > give_up:
                raise RuntimeError("no send succeeded within 60 s")
            time.sleep(0.05)  # waiting for the first send of each lane; bounded above
        worker = Worker(0, cmd, stats, workdir / "worker.log").start()
        assert broker.proc is not None
        bpid = broker.proc.pid
        say(
            f"soak: {minutes:g} min at {rate:g} msg/s, window {window_s:g} s, warm-up "
            f"{warmup:.0f} s; broker pid {bpid}, consumer pid {worker.pid}"
        )
        tail = _Tail(stats)
        next_sample = time.monotonic() + window_s
        while any(t.is_alive() for t in producer.threads):
            if producer.errors:
                raise producer.errors[0]
            time.sleep(max(0.0, min(POLL_S, next_sample - time.monotonic())))  # pacing
            if time.monotonic() < next_sample:
                continue
            next_sample += window_s
            for w in tail.new_lines():
                w.update(
                    consumer_rss_mb=w.pop("rss_kb") / 1024,
                    consumer_fds=w.pop("fds"),
                    broker_rss_mb=rss_kb(bpid) / 1024,
                    broker_fds=open_fds(bpid),
                    load1=os.getloadavg()[0],
                    stored=sum(producer.sent.values()) + sum(producer.duplicated.values()),
                )
                figures.windows.append(w)
                if len(figures.windows) % max(1, int(60 / window_s)) == 0:
                    say(
                        f"  [{w['t'] - wall0:5.0f}s] consumed {w['count']:5d}/window, p99 "
                        f"{w['p99']:6.1f} ms, consumer {w['consumer_rss_mb']:.0f} MB "
                        f"{w['consumer_fds']} fds, broker {w['broker_rss_mb']:.0f} MB "
                        f"{w['broker_fds']} fds"
                    )
        if producer.errors:
            raise producer.errors[0]
        figures.sent_by_topic = dict(producer.sent)
        figures.sent = sum(producer.sent.values())
        figures.duplicates_sent = sum(producer.duplicated.values())
        say(f"  sent {figures.sent} (+{figures.duplicates_sent}); draining")
        target = sa.select(sa.func.count(sa.distinct(EFFECTS.c.key))).select_from(EFFECTS)
        give_up = time.monotonic() + DRAIN_S
        while time.monotonic() < give_up:
            with engine.connect() as conn:
                if conn.execute(target).scalar_one() >= figures.sent:
                    figures.drained = True
                    break
            time.sleep(POLL_S)  # polling the effects table; bounded by DRAIN_S
        if not figures.drained:
            figures.failures.append(f"consumer did not catch up within {DRAIN_S:.0f} s")
        worker.stop()
        verdict(engine, dict(producer.sent), figures)
        engine.dispose()
        judged, failures = judge(figures.windows, warmup, wall0)
        figures.judged = judged
        figures.failures += failures
    finally:
        if tail is not None:
            tail.close()
        if worker is not None:
            worker.kill()
        if producer is not None:
            producer.shutdown()
        broker.stop()
        redis.close()
        pg.close()
    figures.wall_s = time.monotonic() - started
    return figures


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(prog="python -m chaos.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=100.0, help="messages/s over both topics")
    p.add_argument("--window", type=float, default=10.0, help="sampling window, seconds")
    p.add_argument("--warmup", type=float, default=None, help="seconds excluded from judging")
    p.add_argument("--out", type=Path, default=None, help="write the windows as JSON lines")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="idemp-soak-") as tmp:
        workdir = args.workdir or Path(tmp)
        figures = run(
            args.minutes,
            rate=args.rate,
            workdir=workdir,
            window_s=args.window,
            warmup_s=args.warmup,
        )
    if args.out is not None:
        args.out.write_text("".join(json.dumps(w) + "\n" for w in figures.windows))
    for name, j in figures.judged.items():
        print(
            f"  {name}: first third {j['first']:.1f}, last third {j['last']:.1f} "
            f"(bound {j['bound']:.1f})"
        )
    for failure in figures.failures:
        print(f"  FAILED: {failure}")
    print(figures.line(), flush=True)
    return 0 if figures.ok else 1


if __name__ == "__main__":
    sys.exit(main())
