"""The official ``rocketmq-client-python`` PushConsumer through idemp's adapter.

``idemp.adapters.official.callback`` turns an idemp listener into the official client's
callback: it builds an ``idemp.Message``, and it catches every exception itself and
returns RECONSUME_LATER (the official wrapper would ack a message whose callback
raises). Sent with the official Producer, duplicates included.

    python examples/official_push_consumer.py
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from _embedded import broker, wait_until

from idemp import Message, idempotent, stats
from idemp.adapters.official import callback
from idemp.strategies import UniqueKeyTable

TOPIC, GROUP = "OfficialOrders", "official-orders"
ORDERS = 10


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HOME"] = tmp  # the C++ client writes its logs under $HOME/logs
        from rocketmq.client import Message as RMQMessage
        from rocketmq.client import Producer, PushConsumer

        effects: Counter[str] = Counter()
        lock = threading.Lock()
        with broker() as namesrv:
            strategy = UniqueKeyTable(f"sqlite:///{Path(tmp) / 'orders.db'}")

            @idempotent(key="keys", strategy=strategy, name="official")
            def handle(message: Message) -> None:
                with lock:
                    effects[message.keys[0]] += 1

            producer = Producer("official-producer")
            producer.set_namesrv_addr(namesrv)
            producer.start()
            for i in range(ORDERS):
                for _ in range(2 if i % 3 == 0 else 1):  # producer retries
                    msg = RMQMessage(TOPIC)
                    msg.set_keys(f"order-{i}")
                    msg.set_body(f'{{"order": {i}}}'.encode())
                    for attempt in range(10):  # a fresh producer may miss the route
                        try:
                            producer.send_sync(msg)
                            break
                        except Exception:
                            if attempt == 9:
                                raise
                            time.sleep(0.2)  # bounded: ten attempts
            producer.shutdown()
            consumer = PushConsumer(GROUP)
            consumer.set_namesrv_addr(namesrv)
            consumer.subscribe(TOPIC, callback(handle, group=GROUP))
            consumer.start()
            try:
                # At least the 4 producer retries are absorbed; the wheel can add more:
                # a RECONSUME_LATER (a copy found in progress) sends back the rest of its
                # pull batch too, and those come back as duplicates as well.
                wait_until(
                    lambda: len(effects) == ORDERS and stats("official")["duplicates"] >= 4,
                    60,
                    "every order",
                )
            finally:
                consumer.shutdown()
                strategy.close()
    dups = stats("official")["duplicates"]
    print(
        f"effects {sum(effects.values())} for {ORDERS} orders; every producer retry "
        f"absorbed: {dups >= 4} (duplicates absorbed {dups})"
    )
    return 0 if set(effects.values()) == {1} else 1


if __name__ == "__main__":
    raise SystemExit(main())
