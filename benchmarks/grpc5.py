"""RocketMQ 5 benchmark: the official 5.x Python client against idemp's gRPC endpoint,
side by side in one run with real RocketMQ 5.3.3 (its proxy, when ``--real5`` names it)
and with the remoting path of the same idemp broker (the official 4.x client).

Workload: ``--count`` messages of 1 KB sent by one and by four threads (sync sends), then
received and acked by a SimpleConsumer (batches of 32) and consumed by a PushConsumer,
then end-to-end latency at 50 msg/s. Figures: msg/s, send and end-to-end latency
percentiles, broker CPU per message in and out (idemp's process; RocketMQ's JVM when its
pid is known); and, for the two receiving phases, the client's CPU and the TCP segments
with data it received per message (the client is the slower side: these explain its
rate). The 5.x client runs in .cache/v5-venv (``make v5-venv``).

    python -m benchmarks grpc5 [--count 5000] [--rounds 3]
        [--real5 127.0.0.1:18081,127.0.0.1:20911]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.broker import _consume, _send_all, _warm_producer, cpu_seconds
from idemp.broker.process import BrokerProcess
from idemp.tools.admin import update_sub_group, update_topic

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).with_name("grpc5_child.py")
V5_PYTHON = ROOT / ".cache" / "v5-venv" / "bin" / "python"
FIGURES = [
    ("send_1_thread_msg_s", False),
    ("send_4_threads_msg_s", False),
    ("send_p50_ms", True),
    ("send_p99_ms", True),
    ("simple_receive_ack_msg_s", False),
    ("push_consume_msg_s", False),
    ("e2e_p50_ms", True),
    ("e2e_p99_ms", True),
    ("broker_cpu_ms_per_msg", True),
    # the client's side of the two receiving figures (not a target: what explains them)
    ("simple_client_cpu_us_per_msg", True),
    ("push_client_cpu_us_per_msg", True),
    ("simple_segments_in_per_msg", True),
    ("push_segments_in_per_msg", True),
]


def run_v5(
    grpc_addr: str, broker_addr: str, count: int, pid: int | None, home: Path
) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    topic, latency_topic, group = f"Bench5_{run_id}", f"Bench5L_{run_id}", f"Bench5G_{run_id}"
    for t in (topic, latency_topic):
        update_topic(broker_addr, t, 8)
    for suffix in ("_s", "_p", "_l"):
        update_sub_group(broker_addr, group + suffix)
    spec = {
        "endpoint": grpc_addr,
        "topic": topic,
        "latency_topic": latency_topic,
        "group": group,
        "count": count,
    }
    cpu0 = cpu_seconds(pid) if pid else 0.0
    done = subprocess.run(
        [str(V5_PYTHON), str(CHILD), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "HOME": str(home)},
    )
    if done.returncode != 0:
        raise RuntimeError(f"5.x benchmark child failed: {done.stderr[-2000:]}")
    results: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if pid:
        # in: 2 × count + warm-up + latency messages; out: two consumers of 2 × count
        moved = 2 * count + 2 * (2 * count) + 200
        results["broker_cpu_ms_per_msg"] = (cpu_seconds(pid) - cpu0) * 1000 / moved
    return results


def run_remoting(namesrv: str, count: int, pid: int) -> dict[str, Any]:
    from rocketmq.client import Producer

    body = b"x" * 1024
    producer = Producer("Bench4Producer")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    out: dict[str, Any] = {}
    try:
        _warm_producer(producer, "Bench4T")
        cpu0 = cpu_seconds(pid)
        out["send_1_thread_msg_s"] = count / _send_all(producer, "Bench4T", count, 1, body)
        out["send_4_threads_msg_s"] = count / _send_all(producer, "Bench4T", count, 4, body)
        elapsed, seen = _consume(namesrv, "Bench4T", "Bench4Push", 2 * count + 1, False, 300)
        out["push_consume_msg_s"] = seen / elapsed if elapsed else 0.0
        out["broker_cpu_ms_per_msg"] = (cpu_seconds(pid) - cpu0) * 1000 / (4 * count)
    finally:
        producer.shutdown()
    return out


def _java_pid(broker_addr: str) -> int | None:
    """RocketMQ's broker JVM, by the port it listens on (ss), for its CPU figure."""
    port = broker_addr.rsplit(":", 1)[1]
    try:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True)
    except OSError:
        return None
    marker = "pid="
    if marker not in out.stdout:
        return None
    return int(out.stdout.split(marker, 1)[1].split(",", 1)[0])


def run(count: int, real5: str | None, rounds: int = 3) -> dict[str, list[dict[str, Any]]]:
    """Each column's figures per round; the two gRPC columns alternate round by round, so
    a noisy minute on this shared machine lands on both."""
    results: dict[str, list[dict[str, Any]]] = {"idemp gRPC": [], "idemp remoting": []}
    with tempfile.TemporaryDirectory(prefix="idemp-bench5-") as tmp:
        home = Path(tmp)
        os.environ["HOME"] = tmp  # the 4.x client's logs
        broker = BrokerProcess(home / "store", properties={"listenPort": "0"})
        broker.start()
        pid = broker.proc.pid if broker.proc else 0
        try:
            for _ in range(rounds):
                results["idemp gRPC"].append(
                    run_v5(broker.grpc_addr, broker.broker_addr, count, pid, home)
                )
                if real5:
                    grpc_addr, broker_addr = real5.split(",")
                    java = _java_pid(broker_addr)
                    results.setdefault("RocketMQ 5.3.3 gRPC", []).append(
                        run_v5(grpc_addr, broker_addr, count, java, home)
                    )
            results["idemp remoting"].append(run_remoting(broker.namesrv_addr, count, pid))
        finally:
            broker.stop()
    return results


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = sorted(r[key] for r in rows if isinstance(r.get(key), (int, float)))
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    columns = [c for c in results if results[c]]
    rounds = max(len(results[c]) for c in columns)
    lines = [f"{'figure' + (f' (median of {rounds})' if rounds > 1 else ''):28}"]
    lines[0] += "".join(f"{c:>22}" for c in columns)
    for key, _ in FIGURES:
        row = f"{key:28}"
        for c in columns:
            value = _median(results[c], key)
            row += f"{value:22.2f}" if value is not None else f"{'-':>22}"
        lines.append(row)
    base = "RocketMQ 5.3.3 gRPC"
    if results.get(base):
        lines.append(f"idemp gRPC ÷ {base} (> 1: idemp better; medians, then each round):")
        ours, theirs = results["idemp gRPC"], results[base]
        for key, lower in FIGURES:
            a, b = _median(ours, key), _median(theirs, key)
            if not (a and b):
                continue
            line = f"  {key:26} {(b / a if lower else a / b):6.2f}x"
            if rounds > 1:
                each = [
                    (y[key] / x[key] if lower else x[key] / y[key])
                    for x, y in zip(ours, theirs)
                    if x.get(key) and y.get(key)
                ]
                line += "   (" + " ".join(f"{r:.2f}" for r in each) + ")"
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks grpc5")
    p.add_argument("--count", type=int, default=5000, help="messages per send run")
    p.add_argument(
        "--real5",
        default=os.environ.get("REALRMQ5_ENDPOINTS"),
        help="RocketMQ 5.3.3 to compare with: <proxy grpc host:port>,<broker host:port>",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of each gRPC column, alternating; figures are the medians",
    )
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if not V5_PYTHON.exists():
        print(f"{V5_PYTHON} is missing: make v5-venv")
        return 2
    began = time.monotonic()
    results = run(args.count, args.real5, args.rounds)
    print(report(results))
    print(f"({time.monotonic() - began:.0f} s; count {args.count}, rounds {args.rounds})")
    return 0
