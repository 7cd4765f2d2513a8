"""``idemp demo``: the foundation demo on embedded defaults.

Starts idemp's broker on a temporary store, sends messages with the official
RocketMQ client, consumes them with an official PushConsumer, and reports what
happened. Exit 0 only when every message arrived exactly once and intact.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from idemp.broker.process import BrokerProcess

TOPIC = "DemoTopic"


def run_demo(args: argparse.Namespace) -> int:
    count = int(args.messages)
    with tempfile.TemporaryDirectory(prefix="idemp-demo-") as tmp:
        os.environ["HOME"] = tmp  # the official client writes its logs under $HOME/logs
        broker = BrokerProcess(Path(tmp) / "store")
        started = time.monotonic()
        with broker:
            print(f"broker: {broker.ready_line}")
            return _exchange(broker.namesrv_addr, count, started)


def _exchange(namesrv: str, count: int, started: float) -> int:
    from rocketmq.client import ConsumeStatus, Message, Producer, PushConsumer

    producer = Producer("DemoProducerGroup")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    sent: dict[str, bytes] = {}
    t0 = time.monotonic()
    for i in range(count):
        msg = Message(TOPIC)
        msg.set_keys(f"order-{i}")
        msg.set_tags("created")
        msg.set_body(f"{i} order-{i} created".encode())
        for attempt in range(5):
            try:
                producer.send_sync(msg)
                break
            except Exception:  # the first send of a fresh producer may race its route
                if attempt == 4:
                    raise
                time.sleep(0.2)
        sent[f"order-{i}"] = f"{i} order-{i} created".encode()
    send_s = time.monotonic() - t0
    print(f"sent {count} messages in {send_s:.2f}s with the official client")

    received: dict[str, list[bytes]] = {}
    lock = threading.Lock()
    done = threading.Event()

    def on_message(msg) -> ConsumeStatus:  # type: ignore[no-untyped-def]
        key = msg.keys.decode()
        with lock:
            received.setdefault(key, []).append(msg.body)
            if sum(len(v) for v in received.values()) >= count:
                done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer("DemoConsumerGroup")
    consumer.set_namesrv_addr(namesrv)
    consumer.subscribe(TOPIC, on_message, "*")
    t1 = time.monotonic()
    consumer.start()
    done.wait(60)
    consume_s = time.monotonic() - t1
    consumer.shutdown()
    producer.shutdown()
    dups = sum(len(v) - 1 for v in received.values() if len(v) > 1)
    missing = [k for k in sent if k not in received]
    corrupt = [k for k, v in received.items() if any(b != sent.get(k) for b in v)]
    print(
        f"consumed {sum(len(v) for v in received.values())} deliveries of {len(received)} keys "
        f"in {consume_s:.2f}s: duplicates={dups} missing={len(missing)} corrupt={len(corrupt)}"
    )
    ok = not missing and not corrupt and dups == 0
    print(f"demo {'OK' if ok else 'FAILED'} in {time.monotonic() - started:.1f}s")
    return 0 if ok else 1
