"""Orderly consumption by sharding key (the OrderlyRunner, RocketMQ's three locks).

Events of one order are sent with the order id as sharding key, so they land on one
queue (``std::hash(key) % queues``, like the official client); the OrderlyRunner locks
each queue at the broker and locally and hands its messages to the listener one at a
time, in queue order. Duplicates (producer retries) are absorbed by a unique-key table.

    python examples/orderly_sharding.py
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

from _embedded import broker, producer, send, settings, wait_until

from idemp import Message, idempotent, stats
from idemp.runners import OrderlyRunner
from idemp.strategies import UniqueKeyTable

TOPIC, GROUP = "OrderSteps", "order-steps"
ORDERS, STEPS = 12, 5


def main() -> int:
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory() as tmp, broker() as namesrv:
        strategy = UniqueKeyTable(f"sqlite:///{Path(tmp) / 'steps.db'}")

        @idempotent(key="keys", strategy=strategy, name="order-steps")
        def on_step(message: Message) -> None:
            step = message.json()
            with lock:
                seen.setdefault(step["order"], []).append(step["step"])

        p = producer(namesrv)
        for step in range(STEPS):  # interleaved across orders, in order within each
            for i in range(ORDERS):
                body = json.dumps({"order": f"o-{i}", "step": step})
                for _ in range(2 if (i + step) % 7 == 0 else 1):
                    send(p, TOPIC, body, f"o-{i}#{step}", sharding_key=f"o-{i}")
        p.shutdown()
        consumer, client = settings(namesrv, GROUP)
        consumer.consume_thread_count = 4
        runner = OrderlyRunner(on_step, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_until(
                lambda: sum(map(len, seen.values())) == ORDERS * STEPS,
                90,
                "every step of every order",
            )
        finally:
            runner.shutdown()
            strategy.close()
    in_order = all(s == list(range(STEPS)) for s in seen.values())
    print(
        f"{len(seen)} orders x {STEPS} steps, each order's steps in send order: {in_order}; "
        f"duplicates absorbed {stats('order-steps')['duplicates']}"
    )
    return 0 if in_order and len(seen) == ORDERS else 1


if __name__ == "__main__":
    raise SystemExit(main())
