"""The soak's consumer process: ``python -m chaos.soak_worker`` (started by ``chaos.soak``).

Two decorated listeners, one runner each, as a service would run them for hours:

* ``SoakPay`` (concurrent): unique-key table on PostgreSQL in transactional mode, the
  effect row in the dedup row's transaction; a background purge keeps the table at its
  retention, as operations would schedule it.
* ``SoakSeq`` (orderly by stream): Redis flag with a short retention (Redis memory stays
  flat too); the effect's transaction also advances the stream's cursor, so a repeat or an
  event applied ahead of its predecessor is visible in the business data.

Every ``--window`` seconds it appends one JSON line to ``--stats``: deliveries in the
window, end-to-end latency percentiles (born timestamp → listener, ms), its own RSS and
open file descriptors. The orchestrator reads those lines; nothing here judges them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from chaos.app import EFFECTS, apply_in_sequence
from idemp.message import Message

PAY_TOPIC, PAY_GROUP = "SoakPay", "soak-pay"
SEQ_TOPIC, SEQ_GROUP = "SoakSeq", "soak-seq"
DEDUP_TABLE = "soak_dedup"
REDIS_PREFIX = "soak"


def rss_kb(pid: int | str = "self") -> int:
    """Resident set size from /proc (kB); 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def open_fds(pid: int | str = "self") -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, int(round(q * len(sorted_values) + 0.5)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class Latencies:
    """Per-window latency samples, swapped out atomically by the reporter thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: list[float] = []

    def add(self, ms: float) -> None:
        with self._lock:
            self._samples.append(ms)

    def take(self) -> list[float]:
        with self._lock:
            samples, self._samples = self._samples, []
        samples.sort()
        return samples


class SoakConsumers:
    def __init__(self, namesrv: str, pg_url: str, redis_url: str, *, retention_s: float) -> None:
        from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings
        from idemp.pipeline import idempotent
        from idemp.runners import ConcurrentRunner, OrderlyRunner
        from idemp.strategies import RedisFlag, UniqueKeyTable

        logging.getLogger("idemp").setLevel(logging.ERROR)
        pid = os.getpid()
        self.latency = Latencies()
        self.engine = engine = sa.create_engine(
            pg_url, pool_size=4, max_overflow=4, pool_pre_ping=True
        )
        self.uk = UniqueKeyTable(
            pg_url, table=DEDUP_TABLE, transactional=True, deadline_s=30.0, retention_s=retention_s
        )
        self.flag = RedisFlag(
            redis_url, prefix=REDIS_PREFIX, deadline_s=30.0, retention_s=retention_s
        )
        latency = self.latency

        def seen(message: Message) -> None:
            latency.add(time.time() * 1000.0 - message.born_timestamp)

        @idempotent(key="keys", strategy=self.uk, name="soak-pay")
        def pay(message: Message, ctx: Any) -> None:
            seen(message)
            ctx.connection.execute(
                EFFECTS.insert().values(
                    topic=PAY_TOPIC,
                    key=message.key,
                    entity=message.key,
                    n=0,
                    gap=False,
                    pid=pid,
                    msg_id=message.msg_id,
                )
            )

        @idempotent(key="keys", strategy=self.flag, name="soak-seq")
        def seq(message: Message) -> None:
            seen(message)
            apply_in_sequence(engine, message, pid, SEQ_TOPIC)  # False: applied already

        client = ClientSettings(namesrv_addr=namesrv)
        self.runners: list[Any] = []
        for fn, topic, group, cls in (
            (pay, PAY_TOPIC, PAY_GROUP, ConcurrentRunner),
            (seq, SEQ_TOPIC, SEQ_GROUP, OrderlyRunner),
        ):
            settings = ConsumerSettings(
                group=group, consume_from=ConsumeFrom.FIRST_OFFSET, consume_thread_count=4
            )
            runner = cls(fn, settings=settings, client=client)
            runner.subscribe(topic)
            self.runners.append(runner)

    def start(self) -> None:
        for runner in self.runners:
            runner.start(timeout=60)

    def purge(self) -> int:
        return self.uk.purge(batch_size=500)

    def shutdown(self) -> None:
        try:
            for runner in self.runners:
                runner.shutdown(30)
        finally:
            self.uk.close()
            self.flag.close()
            self.engine.dispose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.soak_worker")
    p.add_argument("--namesrv", required=True)
    p.add_argument("--pg", required=True)
    p.add_argument("--redis", required=True)
    p.add_argument("--stats", required=True, type=Path)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--retention", type=float, default=120.0)
    args = p.parse_args(argv)
    consumers = SoakConsumers(args.namesrv, args.pg, args.redis, retention_s=args.retention)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumers.start()
    print("worker started", flush=True)
    purged = 0
    with open(args.stats, "a", encoding="utf-8") as out:
        while not stop.wait(args.window):
            purged += consumers.purge()
            samples = consumers.latency.take()
            out.write(
                json.dumps(
                    {
                        "t": time.time(),
                        "count": len(samples),
                        "p50": percentile(samples, 0.50),
                        "p99": percentile(samples, 0.99),
                        "max": samples[-1] if samples else 0.0,
                        "rss_kb": rss_kb(),
                        "fds": open_fds(),
                        "threads": threading.active_count(),
                        "purged": purged,
                    }
                )
                + "\n"
            )
            out.flush()
    consumers.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
