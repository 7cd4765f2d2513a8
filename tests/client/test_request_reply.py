"""Request-reply with idemp's client (the Java client's ``producer.request``): the
requester waits for the reply that a consumer sends with ``create_reply``, pushed back to
it by the broker. The same round trip was run against RocketMQ 4.9.7, and with the Java
client on either side (make interop covers the Java pair)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import (
    ClientSettings,
    ConsumeFrom,
    ConsumerSettings,
    OutMessage,
    Producer,
    ProducerSettings,
    ReplyTimeout,
    create_reply,
)
from idemp.message import Message
from idemp.runners import ConcurrentRunner


def test_a_request_gets_the_reply_its_consumer_sends(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    broker = make_broker()
    responder = Producer(broker.namesrv_addr, "reply-p").start()
    requests: list[Message] = []  # list.append is atomic: the consume threads need no lock

    def answer(message: Message) -> None:
        requests.append(message)
        responder.send(create_reply(message, b"re:" + message.body))

    runner = ConcurrentRunner(
        answer,
        settings=ConsumerSettings(group="reply-g", consume_from=ConsumeFrom.FIRST_OFFSET),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr),
    )
    runner.subscribe("ReqT")
    runner.start()
    requester = Producer(broker.namesrv_addr, "request-p").start()
    try:
        replies = [requester.request(OutMessage("ReqT", f"ping{i}".encode()), 30) for i in range(3)]
        assert [r.body for r in replies] == [b"re:ping0", b"re:ping1", b"re:ping2"]
        first = replies[0]
        assert first.topic == "DefaultCluster_REPLY_TOPIC"
        props = dict(first.properties)
        assert props["MSG_TYPE"] == "reply"
        assert props["CORRELATION_ID"] == requests[0].property("CORRELATION_ID")
        assert props["REPLY_TO_CLIENT"] == requests[0].property("REPLY_TO_CLIENT")
        assert requests[0].property("TTL") == "30000"
        assert props["PUSH_REPLY_TIME"].isdigit() and props["ARRIVE_TIME"].isdigit()
        assert len({r.property("CORRELATION_ID") for r in replies}) == 3
    finally:
        requester.shutdown()
        runner.shutdown()
        responder.shutdown()


def test_a_request_and_its_reply_within_a_namespace(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Both sides in namespace ns1: the request goes to ``ns1%ReqNsT``, the reply to
    ``ns1%DefaultCluster_REPLY_TOPIC``, and the reply keeps that name, as the Java
    client's does (interop's ``replyns``, the same on RocketMQ 4.9.7, 2026-11-28)."""
    broker = make_broker()
    client = ClientSettings(namesrv_addr=broker.namesrv_addr, namespace="ns1")
    responder = Producer(settings=ProducerSettings(group="reply-p"), client=client).start()
    asked: list[str] = []

    def answer(message: Message) -> None:
        asked.append(message.topic)
        responder.send(create_reply(message, b"re:" + message.body))

    runner = ConcurrentRunner(
        answer,
        settings=ConsumerSettings(group="reply-g", consume_from=ConsumeFrom.FIRST_OFFSET),
        client=client,
    )
    runner.subscribe("ReqNsT")
    runner.start()
    requester = Producer(settings=ProducerSettings(group="request-p"), client=client).start()
    try:
        reply = requester.request(OutMessage("ReqNsT", b"ping"), 30)
    finally:
        requester.shutdown()
        runner.shutdown()
        responder.shutdown()
    assert (reply.body, reply.topic) == (b"re:ping", "ns1%DefaultCluster_REPLY_TOPIC")
    assert reply.property("MSG_TYPE") == "reply"
    assert asked == ["ReqNsT"]


def test_a_request_nobody_answers_times_out(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker()
    requester = Producer(broker.namesrv_addr, "lonely-p").start()
    try:
        with pytest.raises(ReplyTimeout, match="no reply came within 0.5 s"):
            requester.request(OutMessage("NobodyListens", b"hello?"), 0.5)
    finally:
        requester.shutdown()


def test_only_a_stored_message_can_be_answered() -> None:
    with pytest.raises(ValueError, match="has no CLUSTER property"):
        create_reply(Message("T", b"x", msg_id="M1"), b"re")
