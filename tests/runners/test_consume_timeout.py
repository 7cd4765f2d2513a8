"""A listener stuck longer than ``consume_timeout_minutes`` does not hold its queue's
committed offset back for ever: its message is sent back (delay level 3) and the offset
moves past it, as Java's ConsumeMessageConcurrentlyService.cleanExpireMsg does."""

from __future__ import annotations

import threading
from collections.abc import Callable

from idemp import Message
from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.runners import ConcurrentRunner
from tests.client.conftest import FAST_DELAYS, wait_for


def test_a_stuck_listeners_message_is_sent_back_and_the_offset_moves_on(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    broker = make_broker(messageDelayLevel=FAST_DELAYS)
    topic, group = "Stuck", "stuck"
    release = threading.Event()
    seen: list[tuple[str, int]] = []

    def listener(message: Message) -> None:
        seen.append((message.key or "", message.reconsume_times))
        if message.key == "stuck" and message.reconsume_times == 0:
            release.wait(60)  # hangs until the test is done with it

    runner = ConcurrentRunner(
        listener,
        settings=ConsumerSettings(
            group=group,
            consume_from=ConsumeFrom.FIRST_OFFSET,
            consume_timeout_minutes=0.02,  # 1.2 s
        ),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0),
    )
    runner.subscribe(topic)
    producer = Producer(broker.namesrv_addr, f"{group}-p").start()
    try:
        # one queue: the stuck message holds back the offset of the one after it
        first = producer.send_orderly(OutMessage(topic, b"1", keys=["stuck"]), "q")
        producer.send_orderly(OutMessage(topic, b"2", keys=["after"]), "q")
        runner.start()
        wait_for(lambda: ("stuck", 1) in seen, 30, "the stuck message sent back and again")
        offsets = runner.consumer.offsets
        assert offsets is not None
        mq = next(
            q
            for q in runner.consumer.process_queues
            if (q.topic, q.queue_id) == (topic, first.queue.queue_id)
        )
        wait_for(lambda: offsets.read_memory(mq) == 2, 30, "the offset past both")
    finally:
        release.set()
        runner.shutdown()
        producer.shutdown()
    assert sorted(seen) == [("after", 0), ("stuck", 0), ("stuck", 1)]
    assert runner.expired_count == 1
