"""End to end: the official client's PushConsumer, through ``idemp.adapters.official``,
against idemp's broker, with duplicates injected by the producer (same key, new msgId)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from idemp import Message, Outcome, idempotent, stats
from idemp.adapters.official import callback, to_message
from tests.realbroker import broker_of

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers

pytestmark = pytest.mark.official

TOPIC, GROUP, KEYS = "IdempOrders", "idemp-e2e", 20


def _send(producer: Any, message: Any) -> str:
    for attempt in range(10):  # a fresh producer's first sends can miss the route
        try:
            return str(producer.send_sync(message).msg_id)
        except Exception as exc:
            if "No route info" not in str(exc) or attempt == 9:
                raise
            time.sleep(0.2)  # the client is still fetching the route: bounded, 10 tries
    raise AssertionError("unreachable")


def test_producer_duplicates_have_one_effect(
    tmp_path: Path, client_home: Path, make_strategy: Any
) -> None:
    from rocketmq.client import Message as RMQMessage
    from rocketmq.client import Producer, PushConsumer

    strategy, _ = make_strategy("redis")
    broker = broker_of(tmp_path / "store", None, HERE).start()
    effects: Counter[str] = Counter()
    deliveries: list[Message] = []
    lock = threading.Lock()
    done = threading.Event()

    @idempotent(key="keys", strategy=strategy, name="e2e")
    def handle(message: Message) -> None:
        with lock:
            effects[message.keys[0]] += 1

    def listener(message: Message) -> Any:
        result = handle(message)
        with lock:
            deliveries.append(message)
            if len(deliveries) >= 2 * KEYS:
                done.set()
        return result

    producer = Producer("idemp-e2e-producer")
    producer.set_namesrv_addr(broker.namesrv_addr)
    producer.start()
    consumer = PushConsumer(GROUP)
    consumer.set_namesrv_addr(broker.namesrv_addr)
    try:
        msg_ids: dict[str, set[str]] = {}
        for i in range(KEYS):
            for copy in range(2):  # the producer "retries": same key and body, new msgId
                m = RMQMessage(TOPIC)
                m.set_keys(f"order-{i} extra-{copy}")
                m.set_tags("created")
                m.set_property("tenant", "acme")
                m.set_body(f'{{"order": {i}}}'.encode())
                msg_ids.setdefault(f"order-{i}", set()).add(_send(producer, m))
        consumer.subscribe(TOPIC, callback(listener, group=GROUP, properties=["tenant"]))
        consumer.start()
        assert done.wait(60), f"only {len(deliveries)} of {2 * KEYS} deliveries arrived"
    finally:
        consumer.shutdown()
        producer.shutdown()
        broker.stop()

    assert effects == Counter({f"order-{i}": 1 for i in range(KEYS)})
    assert all(len(ids) == 2 for ids in msg_ids.values())
    counted = stats("e2e")
    assert counted["processed"] == KEYS
    # The rest were absorbed: the producer duplicates, plus whatever the broker redelivered
    # (seen here: a few extra deliveries around the consumer's shutdown).
    assert counted["duplicates"] + counted["in_progress"] == len(deliveries) - KEYS
    assert counted["duplicates"] >= 1
    sample = deliveries[0]
    assert sample.topic == TOPIC and sample.consumer_group == GROUP
    assert sample.tags == "created" and sample.properties.get("tenant") == "acme"
    assert len(sample.keys) == 2 and sample.keys[1].startswith("extra-")
    assert sample.msg_id in msg_ids[sample.keys[0]]
    assert sample.queue_id >= 0 and sample.queue_offset >= 0 and sample.born_timestamp > 0
    assert strategy.get(f"{GROUP}/{TOPIC}", "order-0").status == "CONSUMED"


class _Recv:
    """A stand-in for the wheel's RecvMessage (bytes where the wheel returns bytes)."""

    topic = "T"
    tags = b""
    keys = b"a  b"
    body = b"x"
    id = "ID"
    queue_id = 1
    queue_offset = 2
    reconsume_times = 0
    born_timestamp = 3
    store_timestamp = 4

    def get_property(self, name: str) -> bytes:
        return b""


def test_callback_catches_everything_and_reconsumes() -> None:
    from rocketmq.client import ConsumeStatus

    class Boom(BaseException):
        pass

    def raises(message: Message) -> None:
        raise Boom()

    def declines(message: Message) -> Any:
        return Outcome.IN_PROGRESS

    def acks(message: Message) -> None:
        return None

    def bad_return(message: Message) -> Any:
        return "yes"

    got = [callback(fn, group="g")(_Recv()) for fn in (raises, declines, acks, bad_return)]
    assert got == [
        ConsumeStatus.RECONSUME_LATER,
        ConsumeStatus.RECONSUME_LATER,
        ConsumeStatus.CONSUME_SUCCESS,
        ConsumeStatus.RECONSUME_LATER,
    ]
    with pytest.raises(KeyboardInterrupt):

        def interrupted(message: Message) -> None:
            raise KeyboardInterrupt

        callback(interrupted, group="g")(_Recv())
    converted = to_message(_Recv(), group="g")
    assert (converted.keys, converted.tags, converted.consumer_group) == (("a", "b"), None, "g")
