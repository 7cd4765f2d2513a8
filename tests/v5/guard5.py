"""``@guarded`` on a FIFO group of the official RocketMQ 5 PushConsumer, in a child process
of .cache/v5-venv (see test_adapter.py).

    python guard5.py '{"endpoint": ..., "topic": ..., "group": ..., "db": ..., "expect": N}'

Each ride is its own message group. The listener applies the ride-hailing state machine's
transitions; one that comes before its predecessor is held (not acked), which on a FIFO
group holds back only that ride's queue. Prints every applied transition with its time.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq import ClientConfiguration, Credentials, FilterExpression, PushConsumer

from idemp import Message, guarded, stats
from idemp.adapters import rocketmq5
from idemp.guards import RIDE_HAILING_ORDER, SqlStateStore


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    applied: list[dict[str, Any]] = []
    lock = threading.Lock()

    @guarded(
        RIDE_HAILING_ORDER,
        entity="json:$.ride",
        target="json:$.state",
        store=SqlStateStore(f"sqlite:///{spec['db']}"),
        name="rides5",
    )
    def on_event(message: Message) -> None:
        event = message.json()
        with lock:
            applied.append({"ride": event["ride"], "state": event["state"], "at": time.monotonic()})

    cfg = ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=10)
    listener = rocketmq5.listener(on_event, group=spec["group"])
    consumer = PushConsumer(cfg, spec["group"], listener, {spec["topic"]: FilterExpression("*")})
    consumer.startup()
    deadline = time.monotonic() + spec["within"]
    while len(applied) < spec["expect"] and time.monotonic() < deadline:
        time.sleep(0.2)  # the consumer works on its own threads; poll what it applied
    consumer.shutdown()
    print(json.dumps({"applied": applied, "stats": stats("rides5")}), flush=True)


if __name__ == "__main__":
    main()
