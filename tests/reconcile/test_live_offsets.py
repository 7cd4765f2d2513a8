"""``--offsets broker://HOST:PORT?group=G&topic=T`` (or a cluster's, ``namesrv://…``):
committed offsets read live with QUERY_CONSUMER_OFFSET equal what the broker persists in
consumerOffset.json."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import ConsumeResult, Message
from idemp.reconcile.loaders import (
    InputError,
    load_broker_offsets,
    load_cluster_offsets,
    load_offsets,
)
from idemp.runners import ConcurrentRunner
from tests.client.conftest import FAST_DELAYS, wait_for
from tests.realbroker import start_broker


@pytest.fixture
def broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """idemp's broker, or RocketMQ 4.9.7 with IDEMP_4X_REAL (its consumerOffset.json is
    fastjson's, bare integer keys and all)."""
    b = start_broker(tmp_path / "store", {"messageDelayLevel": FAST_DELAYS}, request.path)
    yield b
    b.stop()


def test_live_offsets_equal_the_persisted_table(broker: BrokerProcess) -> None:
    producer = Producer(broker.namesrv_addr, "offsets-producer").start()
    lock = threading.Lock()
    seen: list[bytes] = []

    def listener(msg: Message) -> ConsumeResult:
        with lock:
            seen.append(msg.body)
        failed_once = msg.body == b"5 once" and msg.reconsume_times == 0
        return ConsumeResult.RECONSUME_LATER if failed_once else ConsumeResult.SUCCESS

    runner = ConcurrentRunner(
        listener,
        settings=ConsumerSettings(group="g-live", consume_from=ConsumeFrom.FIRST_OFFSET),
        client=ClientSettings(
            namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0, persist_offset_interval=0.5
        ),
    )
    runner.subscribe("TO")
    try:
        sent = [producer.send(OutMessage("TO", f"{i} once".encode())) for i in range(10)]
        runner.start()
        # 10 deliveries, then the failed one again from %RETRY%g-live.
        wait_for(lambda: len(seen) == 11, 30, "10 messages and one redelivery")
    finally:
        runner.shutdown()  # persists the offsets synchronously
        producer.shutdown()

    url = f"broker://{broker.broker_addr}?group=g-live&topic=TO"
    live = load_broker_offsets(url)
    assert live.source == url
    # Everything was consumed: each queue's offset is the number of messages sent to it.
    per_queue = {q: sum(1 for r in sent if r.queue.queue_id == q) for q in range(4)}
    assert live.rows() == [("%RETRY%g-live", "g-live", 0, 1)] + [
        ("TO", "g-live", q, n) for q, n in sorted(per_queue.items())
    ]
    assert load_offsets(url).table == live.table  # the --offsets entry point
    # through the nameserver (namesrv://): the same table, named by its broker
    (cluster,) = load_cluster_offsets(f"namesrv://{broker.namesrv_addr}?group=g-live&topic=TO")
    assert (cluster.broker, cluster.table) == ("broker-a", live.table)
    only_q1 = load_broker_offsets(f"{url}&queues=1")
    assert only_q1.rows() == [("%RETRY%g-live", "g-live", 0, 1), ("TO", "g-live", 1, per_queue[1])]

    broker.stop()  # writes consumerOffset.json
    persisted = load_offsets(broker.store / "config" / "consumerOffset.json")
    assert {k: v for k, v in persisted.table.items() if k[1] == "g-live"} == live.table


def test_live_offsets_need_group_and_topic(broker: BrokerProcess) -> None:
    url = f"broker://{broker.broker_addr}?group=g"
    with pytest.raises(InputError) as err:
        load_broker_offsets(url)
    assert str(err.value) == (
        f"offsets input {url}: expected broker://HOST:PORT?group=G&topic=T "
        "(group, topic repeatable)"
    )


def test_cluster_offsets_need_group_and_topic() -> None:
    url = "namesrv://127.0.0.1:9?topic=T"
    with pytest.raises(InputError) as err:
        load_cluster_offsets(url)
    assert str(err.value) == (
        f"offsets input {url}: expected namesrv://HOST:PORT?group=G&topic=T "
        "(group, topic repeatable)"
    )
