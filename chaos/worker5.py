"""The chaos run's RocketMQ 5 consumer: ``python -m chaos.worker5`` in .cache/v5-venv.

A PushConsumer of the official 5.x client (POP over the broker's gRPC endpoint) runs the
``ChaosPay5`` listener: ``@idempotent`` with the unique-key table on PostgreSQL in
transactional mode, the effect row written in the claim's transaction. Counters are
written to ``--stats`` as ``chaos.worker`` writes them; the run SIGKILLs it at will.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from chaos.app import DEDUP_TABLE, record_payment
from chaos.scenario import PAY5_GROUP, PAY5_TOPIC
from idemp.message import Message

_stats = importlib.import_module("idemp.stats")
SNAPSHOT_INTERVAL_S = 0.5


def snapshot(path: Path) -> None:
    data = {name: _stats.stats(name) for name in _stats.listeners()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # atomic: a SIGKILL never leaves a torn file


def main(argv: list[str] | None = None) -> int:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, PushConsumer

    from idemp.adapters import rocketmq5
    from idemp.pipeline import idempotent
    from idemp.strategies import UniqueKeyTable

    p = argparse.ArgumentParser(prog="python -m chaos.worker5")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--pg", required=True)
    p.add_argument("--stats", required=True, type=Path)
    args = p.parse_args(argv)
    logging.getLogger("idemp").setLevel(logging.CRITICAL)  # store outages: counters tell
    pid = os.getpid()
    uk = UniqueKeyTable(
        args.pg, table=DEDUP_TABLE, transactional=True, deadline_s=5.0, lock_timeout_s=5.0
    )

    @idempotent(key="keys", strategy=uk, name="pay5", group=PAY5_GROUP)
    def pay5(message: Message, ctx: Any) -> None:
        record_payment(ctx.connection, PAY5_TOPIC, message, pid)

    config = ClientConfiguration(args.endpoint, Credentials())
    consumer = PushConsumer(
        config,
        PAY5_GROUP,
        rocketmq5.listener(pay5, group=PAY5_GROUP),
        {PAY5_TOPIC: FilterExpression("*")},
        consumption_thread_count=4,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer.startup()
    print("worker started", flush=True)
    while not stop.wait(SNAPSHOT_INTERVAL_S):
        snapshot(args.stats)
    consumer.shutdown()
    uk.close()
    snapshot(args.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
