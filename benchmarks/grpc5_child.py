"""The RocketMQ 5 workload, run by benchmarks/grpc5.py in .cache/v5-venv (the official
5.x client cannot share a venv with the 4.x wheel). Prints one JSON line of figures.

    python grpc5_child.py '{"endpoint": ..., "topic": ..., "group": ..., "count": N}'
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)

BODY = b"x" * 1024


def _message(topic: str, i: int) -> Message:
    m = Message()
    m.topic = topic
    m.keys = f"k-{i}"
    m.body = BODY
    return m


def send(producer: Producer, topic: str, count: int, threads: int) -> tuple[float, list[float]]:
    per = [count // threads + (1 if t < count % threads else 0) for t in range(threads)]
    latencies: list[list[float]] = [[] for _ in range(threads)]

    def worker(t: int) -> None:
        for i in range(per[t]):
            began = time.perf_counter()
            producer.send(_message(topic, i))
            latencies[t].append((time.perf_counter() - began) * 1000)

    began = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return count / (time.perf_counter() - began), [x for lat in latencies for x in lat]


class _ClientCost:
    """What a consuming phase cost this client process: its CPU (all threads, gRPC's
    own included) and the TCP segments with data it received from the server, per
    message. The client is the slower side on this machine, so these explain its rate:
    a server that sends each response in a segment of its own costs it more."""

    def __init__(self, port: str) -> None:
        self.port = port
        self.cpu = time.process_time()
        self.segs = _segments_in(port)

    def per_message(self, n: int, out: dict[str, float], phase: str) -> None:
        if n <= 0:
            return
        out[f"{phase}_client_cpu_us_per_msg"] = (time.process_time() - self.cpu) * 1e6 / n
        segs = _segments_in(self.port)
        if segs is not None and self.segs is not None:
            # per connection: one closed meanwhile (an earlier phase's) drops out, a new
            # one (this phase's consumer) counts from zero
            got = sum(count - self.segs.get(conn, 0) for conn, count in segs.items())
            out[f"{phase}_segments_in_per_msg"] = got / n


def _segments_in(port: str) -> dict[str, int] | None:
    """Data segments received so far on each of this machine's connections to ``port``,
    by local address (``ss``; None where it is missing). Only this process talks to that
    port during a phase."""
    if shutil.which("ss") is None:
        return None
    got = subprocess.run(["ss", "-tinH", f"dport = :{port}"], capture_output=True, text=True)
    counts: dict[str, int] = {}
    conn = ""
    for line in got.stdout.splitlines():
        if line and not line[0].isspace():  # "ESTAB 0 0 <local> <peer>"
            fields = line.split()
            conn = fields[3] if len(fields) > 3 else ""
            counts[conn] = 0
            continue
        for word in line.split():
            if word.startswith("data_segs_in:"):
                counts[conn] = int(word.split(":", 1)[1])
    return counts


def simple_receive(
    cfg: ClientConfiguration, port: str, topic: str, group: str, count: int, out: dict[str, float]
) -> float:
    consumer = SimpleConsumer(cfg, group, {topic: FilterExpression("*")}, 5)
    consumer.startup()
    # a receive before the settings arrived fails (50001 "settings is null")
    if not consumer._init_settings_event.wait(10):
        raise RuntimeError("no settings from the server within 10 s")
    got = 0
    cost = _ClientCost(port)
    began = time.perf_counter()
    deadline = time.monotonic() + 300
    while got < count and time.monotonic() < deadline:
        for m in consumer.receive(32, 30):
            consumer.ack(m)
            got += 1
    elapsed = time.perf_counter() - began
    cost.per_message(got, out, "simple")
    consumer.shutdown()
    return got / elapsed


class _Counter(MessageListener):
    def __init__(self) -> None:
        self.n = 0
        self.first = 0.0
        self.last = 0.0
        self.latencies: list[float] = []
        self.lock = threading.Lock()

    def consume(self, message: Message) -> ConsumeResult:
        now = time.time()
        with self.lock:
            if not self.n:
                self.first = time.perf_counter()
            self.n += 1
            self.last = time.perf_counter()
            sent = message.properties.get("sent_at")
            if sent:
                self.latencies.append((now - float(sent)) * 1000)
        return ConsumeResult.SUCCESS


def push_consume(
    cfg: ClientConfiguration, port: str, topic: str, group: str, count: int, out: dict[str, float]
) -> float:
    counter = _Counter()
    consumer = PushConsumer(cfg, group, counter, {topic: FilterExpression("*")})
    cost = _ClientCost(port)
    consumer.startup()
    deadline = time.monotonic() + 300
    while counter.n < count and time.monotonic() < deadline:
        time.sleep(0.05)  # the consumer works on its own threads; poll its count
    cost.per_message(counter.n, out, "push")
    consumer.shutdown()
    return counter.n / max(counter.last - counter.first, 1e-9)


def latency(
    cfg: ClientConfiguration,
    producer: Producer,
    topic: str,
    group: str,
    rate: float,
    seconds: float,
) -> list[float]:
    counter = _Counter()
    consumer = PushConsumer(cfg, group, counter, {topic: FilterExpression("*")})
    consumer.startup()
    time.sleep(3)  # assignment and the first long poll in place before timing
    n = int(rate * seconds)
    for i in range(n):
        m = _message(topic, i)
        m.add_property("sent_at", repr(time.time()))
        producer.send(m)
        time.sleep(1 / rate)  # paced: latency at a modest rate, not under saturation
    deadline = time.monotonic() + 60
    while counter.n < n and time.monotonic() < deadline:
        time.sleep(0.05)
    consumer.shutdown()
    return counter.latencies


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    cfg = ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=10)
    topic, count = spec["topic"], spec["count"]
    producer = Producer(cfg, (topic, spec["latency_topic"]))
    producer.startup()
    producer.send(_message(topic, -1))  # routes and connection in place
    out: dict[str, float] = {}
    out["send_1_thread_msg_s"], lat1 = send(producer, topic, count, 1)
    out["send_p50_ms"], out["send_p99_ms"] = pct(lat1, 0.5), pct(lat1, 0.99)
    out["send_4_threads_msg_s"], _ = send(producer, topic, count, 4)
    total = 2 * count + 1
    port = spec["endpoint"].rsplit(":", 1)[1]
    group = spec["group"]
    out["simple_receive_ack_msg_s"] = simple_receive(cfg, port, topic, group + "_s", total, out)
    out["push_consume_msg_s"] = push_consume(cfg, port, topic, group + "_p", total, out)
    lats = latency(cfg, producer, spec["latency_topic"], spec["group"] + "_l", 50, 4)
    out["e2e_p50_ms"], out["e2e_p99_ms"] = pct(lats, 0.5), pct(lats, 0.99)
    out["e2e_mean_ms"] = statistics.fmean(lats) if lats else float("nan")
    producer.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
