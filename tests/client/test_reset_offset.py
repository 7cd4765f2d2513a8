"""mqadmin resetOffsetByTime against idemp's broker with idemp's client online: the broker
sends the offsets (RocketMQ's ResetOffsetBody, MessageQueue objects as map keys) and the
client consumes again from them (issue 12 §2: the client used to ignore the body)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import Message
from idemp.remoting import RequestCode, ResponseCode
from idemp.remoting.jsonlenient import loads_fastjson
from idemp.runners import ConcurrentRunner
from tests.broker.rawclient import RawClient
from tests.client.conftest import wait_for


def test_reset_by_time_makes_the_online_consumer_consume_again(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    broker = make_broker()
    seen: list[bytes] = []
    lock = threading.Lock()

    def listener(msg: Message) -> None:
        with lock:
            seen.append(msg.body)

    producer = Producer(broker.namesrv_addr, "reset-p").start()
    for i in range(5):
        producer.send(OutMessage("ResetT", f"m{i}".encode()))
    producer.shutdown()
    runner = ConcurrentRunner(
        listener,
        settings=ConsumerSettings(group="reset-g", consume_from=ConsumeFrom.FIRST_OFFSET),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr, persist_offset_interval=0.2),
    )
    runner.subscribe("ResetT")
    runner.start()
    try:
        wait_for(lambda: len(seen) == 5, 30, "the five messages")
        with RawClient(broker.broker_addr) as admin:
            wait_for(
                lambda: (
                    sum(
                        int(
                            admin.request(
                                RequestCode.QUERY_CONSUMER_OFFSET,
                                {"consumerGroup": "reset-g", "topic": "ResetT", "queueId": q},
                            ).ext_fields.get("offset", "0")
                        )
                        for q in range(4)
                    )
                    == 5
                ),
                30,
                "the offsets committed",
            )
            reset = admin.request(
                RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                {"topic": "ResetT", "group": "reset-g", "timestamp": 0, "isForce": "true"},
            )
        assert (reset.code, reset.remark) == (ResponseCode.SUCCESS, "not set any response code")
        offsets = loads_fastjson(reset.body)["offsetTable"]
        assert sorted((k["queueId"], v) for k, v in offsets) == [(q, 0) for q in range(4)]
        wait_for(lambda: len(seen) == 10, 30, "every message consumed again")
    finally:
        runner.shutdown()
    assert sorted(seen) == sorted([f"m{i}".encode() for i in range(5)] * 2)
