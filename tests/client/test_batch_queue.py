"""``Producer.send_batch(msgs, queue)``: an ordered batch to one chosen queue, the way the
demo sends each trip's events to its sharding key's queue in one request."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import OutMessage, Producer
from idemp.client.sharding import queue_index_for_key


@pytest.fixture
def producer(broker: BrokerProcess) -> Iterator[Producer]:
    p = Producer(broker.namesrv_addr, "batch-queue-producer").start()
    yield p
    p.shutdown()


def test_batch_to_the_sharding_keys_queue(producer: Producer) -> None:
    queues = producer.publish_queues("TBQ")
    assert [q.queue_id for q in queues] == [0, 1, 2, 3]
    mq = queues[queue_index_for_key("order-7", len(queues))]
    first = producer.send_batch([OutMessage("TBQ", f"a{i}".encode()) for i in range(5)], mq)
    second = producer.send_batch([OutMessage("TBQ", f"b{i}".encode()) for i in range(3)], mq)
    assert (first.queue.queue_id, first.queue_offset) == (mq.queue_id, 0)
    assert (second.queue.queue_id, second.queue_offset) == (mq.queue_id, 5)
    assert len(set(first.msg_id.split(",") + second.msg_id.split(","))) == 8
