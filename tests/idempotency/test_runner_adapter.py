"""End to end through idemp's own ConcurrentRunner against idemp's broker, with producer
duplicates (same key, new msgId) and a redelivery (a handler failure → %RETRY%)."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Any

from idemp import Message, idempotent, stats
from idemp.adapters.runner import concurrent
from idemp.client.producer import OutMessage, Producer
from idemp.client.settings import ClientSettings, ConsumeFrom, ConsumerSettings
from idemp.strategies import UniqueKeyTable
from tests.realbroker import broker_of

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers

KEYS = 20
GROUP, TOPIC = "idemp-runner-e2e", "RunnerOrders"


def test_runner_adapter_producer_duplicates_and_redelivery(tmp_path: Path) -> None:
    broker = broker_of(tmp_path / "store", {"messageDelayLevel": "1s " * 18}, HERE)
    broker.start()
    strategy = UniqueKeyTable(f"sqlite:///{tmp_path / 'dedup.db'}")
    effects: collections.Counter[str] = collections.Counter()
    deliveries: list[Message] = []
    lock = threading.Lock()
    failed_once: set[str] = set()

    @idempotent(key="keys", strategy=strategy, name="runner-e2e")
    def handle(message: Message) -> None:
        key = message.keys[0]
        if key == "order-3" and key not in failed_once:
            failed_once.add(key)
            raise RuntimeError("first attempt fails: the broker redelivers")
        with lock:
            effects[key] += 1

    def observed(message: Message) -> Any:
        result = handle(message)
        with lock:  # recorded once its outcome is counted
            deliveries.append(message)
        return result

    def redelivered() -> list[Message]:
        return [m for m in deliveries if m.keys[0] == "order-3" and m.reconsume_times > 0]

    settings = ConsumerSettings(group=GROUP, consume_from=ConsumeFrom.FIRST_OFFSET)
    client = ClientSettings(
        namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0, persist_offset_interval=0.5
    )
    runner = concurrent(observed, group=GROUP, settings=settings, client=client)
    runner.subscribe(TOPIC)
    producer = Producer(broker.namesrv_addr, "runner-e2e-producer").start()
    try:
        msg_ids = collections.defaultdict(set)
        for i in range(KEYS):
            for _copy in range(2):  # a producer retry: same key and body, new msgId
                sent = producer.send(
                    OutMessage(TOPIC, f'{{"order": {i}}}'.encode(), keys=[f"order-{i}"])
                )
                msg_ids[f"order-{i}"].add(sent.msg_id)
        runner.start()
        end = time.monotonic() + 60
        while time.monotonic() < end:  # polling the consumer's progress, bounded
            with lock:
                done = {m.msg_id for m in deliveries}
                if len(effects) == KEYS and len(done) >= 2 * KEYS and redelivered():
                    break
            time.sleep(0.05)
    finally:
        runner.shutdown()
        producer.shutdown()
        broker.stop()
        strategy.close()

    assert effects == collections.Counter({f"order-{i}": 1 for i in range(KEYS)})
    assert all(len(ids) == 2 for ids in msg_ids.values())
    assert {m.consumer_group for m in deliveries} == {GROUP}
    assert redelivered(), "order-3 was not redelivered after its failure"
    counted = stats("runner-e2e")
    assert (counted["processed"], counted["failures"]) == (KEYS, 1)
    # Everything else was absorbed: the producer duplicates, the failed copy's redelivery,
    # and whatever the broker redelivered besides (a duplicate or, mid-run, in progress).
    rest = counted["duplicates"] + counted["in_progress"]
    assert rest == len(deliveries) - KEYS - 1
    sent_ids = {i for ids in msg_ids.values() for i in ids}
    assert sent_ids <= {m.msg_id for m in deliveries}  # both copies of every key were delivered
