"""Bad input to the gRPC endpoint gets the protocol's status code and a clear message, and
the server keeps serving. Each answer was read off RocketMQ 5.3.3's proxy (IDEMP_V5_REAL
runs this file against it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from idemp.broker.process import BrokerProcess
from idemp.broker.v5.schema import pb
from tests.broker.rawclient import RawClient

from .conftest import Endpoint5
from .raw import Raw, resource, simple_consumer


def _message(topic: str, body: bytes = b"x", **sysp: object) -> Any:
    return pb.Message(
        topic=resource(topic),
        body=body,
        system_properties=pb.SystemProperties(
            message_id="0102FC0000000100000000000000000001", **sysp
        ),
    )


def test_route_of_an_unknown_topic(raw: Raw) -> None:
    answer = raw.unary(
        "QueryRoute", pb.QueryRouteRequest(topic=resource("NoSuchTopic_v5")), pb.QueryRouteResponse
    )
    assert (answer.status.code, answer.status.message) == (
        pb.TOPIC_NOT_FOUND,
        "CODE: 17  DESC: No topic route info in name server for the topic: NoSuchTopic_v5\n"
        "For more information, please visit the url, "
        "https://rocketmq.apache.org/docs/bestPractice/06FAQ",
    )


@pytest.mark.parametrize(
    ("topic", "message"),
    [
        ("", "The specified topic is blank"),
        (
            "a b",
            "The specified topic[a b] contains illegal characters, allowing only "
            "^[%|a-zA-Z0-9_-]+$",
        ),
        ("x" * 128, "The specified topic is longer than topic max length 127."),
        ("SCHEDULE_TOPIC_XXXX", "cannot access system topic"),
        ("RMQ_SYS_TRANS_HALF_TOPIC", "cannot access system topic"),
        ("TBW102", "cannot access system topic"),
        ("rmq_sys_anything", "cannot access system topic"),
    ],
)
def test_illegal_and_system_topics_are_refused(raw: Raw, topic: str, message: str) -> None:
    """GrpcValidator.validateTopic: the client's topic rules, then no system topic."""
    answer = raw.unary(
        "QueryRoute", pb.QueryRouteRequest(topic=resource(topic)), pb.QueryRouteResponse
    )
    assert (answer.status.code, answer.status.message) == (pb.ILLEGAL_TOPIC, message)


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (
            "g h",
            "the specified group[g h] contains illegal characters, allowing only "
            "^[%|a-zA-Z0-9_-]+$",
        ),
        ("g" * 256, "the specified group is longer than group max length 255."),
        ("CID_RMQ_SYS_x", "cannot use system consumer group"),
    ],
)
def test_illegal_and_system_groups_are_refused(
    raw: Raw, admin: RawClient, names: Callable[[str], str], group: str, message: str
) -> None:
    topic = names("T")
    assert admin.create_topic(topic, 1).code == 0
    answer = raw.unary(
        "QueryAssignment",
        pb.QueryAssignmentRequest(topic=resource(topic), group=resource(group)),
        pb.QueryAssignmentResponse,
    )
    assert (answer.status.code, answer.status.message) == (pb.ILLEGAL_CONSUMER_GROUP, message)


def test_a_request_without_client_id(
    raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    topic = names("T")
    assert admin.create_topic(topic, 1).code == 0
    answer = raw.unary(
        "QueryRoute",
        pb.QueryRouteRequest(topic=resource(topic)),
        pb.QueryRouteResponse,
        metadata=(),
    )
    assert (answer.status.code, answer.status.message) == (
        pb.CLIENT_ID_REQUIRED,
        "client id cannot be empty",
    )


def test_send_errors(raw: Raw, admin: RawClient, names: Callable[[str], str]) -> None:
    topic, fifo = names("T"), names("F")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_topic(fifo, 1, attributes="+message.type=FIFO").code == 0
    cases = {
        "too large": pb.SendMessageRequest(
            messages=[_message(topic, b"x" * (4 * 1024 * 1024 + 1))]
        ),
        "wrong type": pb.SendMessageRequest(messages=[_message(fifo)]),
        "no id": pb.SendMessageRequest(messages=[pb.Message(topic=resource(topic), body=b"x")]),
        "system key": pb.SendMessageRequest(
            messages=[
                pb.Message(
                    topic=resource(topic),
                    body=b"x",
                    user_properties={"KEYS": "k"},
                    system_properties=pb.SystemProperties(message_id="01"),
                )
            ]
        ),
        "no messages": pb.SendMessageRequest(),
        "unknown topic": pb.SendMessageRequest(messages=[_message("NoSuchTopic_v5")]),
    }
    got = {}
    for name, request in cases.items():
        answer = raw.unary("SendMessage", request, pb.SendMessageResponse)
        got[name] = (answer.status.code, answer.status.message)
    assert got["too large"] == (
        pb.MESSAGE_BODY_TOO_LARGE,
        "message body cannot exceed the max 4194304",
    )
    conflict = "org.apache.rocketmq.proxy.common.ProxyException: TopicMessageType validate failed"
    assert got["wrong type"] == (
        pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        f"{conflict}, the expected type is FIFO, but actual type is NORMAL",
    )
    assert got["no id"] == (pb.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    assert got["system key"] == (
        pb.ILLEGAL_MESSAGE_PROPERTY_KEY,
        "property is used by system: KEYS",
    )
    assert got["no messages"] == (pb.MESSAGE_CORRUPTED, "no message to send")
    # RocketMQ checks the type first: an unknown topic's type is UNSPECIFIED
    assert got["unknown topic"] == (
        pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        f"{conflict}, the expected type is UNSPECIFIED, but actual type is NORMAL",
    )


def test_send_validation_as_the_proxy(
    raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """SendMessageActivity.buildMessageProperty and GrpcValidator: each answer as RocketMQ
    5.3.3's proxy gave it (2026-11-26); empty tags and keys pass, a message group must stay
    under 64 UTF-8 bytes, a delivery time at most a day ahead."""
    topic, fifo, delay = names("T"), names("F"), names("D")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_topic(fifo, 1, attributes="+message.type=FIFO").code == 0
    assert admin.create_topic(delay, 1, attributes="+message.type=DELAY").code == 0
    day = 86_400_000

    def later(ms: int) -> Timestamp:
        ts = Timestamp()
        ts.FromMilliseconds(int(time.time() * 1000) + ms)
        return ts

    cases = {
        "empty body": (_message(topic, b""), pb.MESSAGE_BODY_EMPTY, "message body cannot be empty"),
        "empty tag": (_message(topic, tag=""), pb.OK, "OK"),
        "blank tag": (
            _message(topic, tag="  "),
            pb.ILLEGAL_MESSAGE_TAG,
            "tag cannot be the char sequence of whitespace",
        ),
        "bar tag": (_message(topic, tag="a|b"), pb.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'"),
        "control tag": (
            _message(topic, tag="a\x01"),
            pb.ILLEGAL_MESSAGE_TAG,
            "tag cannot contain control character",
        ),
        "empty key": (_message(topic, keys=[""]), pb.OK, "OK"),
        "blank key": (
            _message(topic, keys=[" "]),
            pb.ILLEGAL_MESSAGE_KEY,
            "key cannot be the char sequence of whitespace",
        ),
        "control key": (
            _message(topic, keys=["a\x02"]),
            pb.ILLEGAL_MESSAGE_KEY,
            "key cannot contain control character",
        ),
        "blank group": (
            _message(fifo, message_group="  "),
            pb.ILLEGAL_MESSAGE_GROUP,
            "message group cannot be the char sequence of whitespace",
        ),
        "group of 64": (
            _message(fifo, message_group="g" * 64),
            pb.ILLEGAL_MESSAGE_GROUP,
            "message group exceed the max size 64",
        ),
        "group of 63": (_message(fifo, message_group="g" * 63), pb.OK, "OK"),
        "group of 64 bytes": (
            _message(fifo, message_group="é" * 32),
            pb.ILLEGAL_MESSAGE_GROUP,
            "message group exceed the max size 64",
        ),
        "control group": (
            _message(fifo, message_group="g\x03"),
            pb.ILLEGAL_MESSAGE_GROUP,
            "message group cannot contain control character",
        ),
        "two days ahead": (
            _message(delay, delivery_timestamp=later(2 * day)),
            pb.ILLEGAL_DELIVERY_TIME,
            f"the max delay time of message is too large, max is {day}",
        ),
    }
    got, expected = {}, {}
    for name, (message, code, text) in cases.items():
        answer = raw.unary(
            "SendMessage", pb.SendMessageRequest(messages=[message]), pb.SendMessageResponse
        )
        got[name] = (answer.status.code, answer.status.message)
        expected[name] = (code, text)
    assert got == expected


def test_a_mixed_topic_needs_the_broker_setting(
    admin: RawClient, names: Callable[[str], str]
) -> None:
    """RocketMQ 5.3.3's AdminBrokerProcessor with its default enableMixedMessageType."""
    refused = admin.create_topic(names("M"), 1, attributes="+message.type=MIXED")
    assert (refused.code, refused.remark) == (29, "MIXED message type is not supported.")


def test_forged_receipt_handles(raw: Raw, admin: RawClient, names: Callable[[str], str]) -> None:
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 1).code == 0

    def ack(handle: str) -> tuple[int, str, list[tuple[int, str]]]:
        return raw.ack(group, topic, handle)

    def change(handle: str) -> tuple[int, str]:
        return raw.change(group, topic, handle)

    # not a handle at all: RocketMQ 5.3.3 cannot parse it and answers 50001 with what
    # ReceiptHandle.decode threw (the message, its class, its first frame)
    unparsable = {
        "garbage": "Parse failed, dataList size 1. IllegalArgumentException. "
        "org.apache.rocketmq.common.consumer.ReceiptHandle.decode(ReceiptHandle.java:56)",
        "": "Parse failed, dataList size 1. IllegalArgumentException. "
        "org.apache.rocketmq.common.consumer.ReceiptHandle.decode(ReceiptHandle.java:56)",
        "1 2 3 x 5 6 7 8": 'For input string: "x". NumberFormatException. '
        "java.base/java.lang.NumberFormatException.forInputString(NumberFormatException.java:67)",
    }
    for handle, words in unparsable.items():
        assert ack(handle) == (50001, "INTERNAL_SERVER_ERROR", [(50001, words)])
        assert change(handle) == (50001, words)
    # well formed, long past its time: 40013, the proxy's exception
    expired = "org.apache.rocketmq.proxy.common.ProxyException: receipt handle is expired"
    assert ack("1 2 3 4 5 6 7 8") == (40013, "INVALID_RECEIPT_HANDLE", [(40013, expired)])
    # a dead letter needs the handle's commit log offset (a ninth field), not its time
    assert raw.forward(group, topic, "1 2 3 4 5 6 7 8") == (
        pb.INVALID_RECEIPT_HANDLE,
        "org.apache.rocketmq.proxy.common.ProxyException: commit log offset is empty",
    )


def test_client_requests_without_settings_and_unknown_transactions(
    broker5: Endpoint5, admin: RawClient, names: Callable[[str], str]
) -> None:
    """ClientActivity reads heartbeats and terminations against the settings sent on
    Telemetry (none here: 40015); EndTransaction of a half the proxy never sent is its
    ProxyException; a negative invisible duration names its minimum. As RocketMQ 5.3.3
    answered each (2026-11-26)."""
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 1).code == 0
    no_settings = (pb.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client")
    with closing(Raw(broker5.grpc_addr, client_id=names("raw-client@unset"))) as raw:
        got = {
            "heartbeat": raw.unary(
                "Heartbeat",
                pb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER, group=resource(group)),
                pb.HeartbeatResponse,
            ),
            "terminate": raw.unary(
                "NotifyClientTermination",
                pb.NotifyClientTerminationRequest(group=resource(group)),
                pb.NotifyClientTerminationResponse,
            ),
            "end unknown": raw.unary(
                "EndTransaction",
                pb.EndTransactionRequest(
                    topic=resource(topic),
                    message_id="0102FC0000000100000000000000000001",
                    transaction_id="7F00000100002A9F0000000000000000",
                    resolution=pb.COMMIT,
                ),
                pb.EndTransactionResponse,
            ),
            "end garbage": raw.unary(
                "EndTransaction",
                pb.EndTransactionRequest(
                    topic=resource(topic),
                    message_id="01",
                    transaction_id="zz",
                    resolution=pb.COMMIT,
                ),
                pb.EndTransactionResponse,
            ),
            "negative invisible": raw.unary(
                "ChangeInvisibleDuration",
                pb.ChangeInvisibleDurationRequest(
                    group=resource(group),
                    topic=resource(topic),
                    receipt_handle="1 2 3 4 5 6 7 8",
                    message_id="01",
                    invisible_duration={"seconds": -5},
                ),
                pb.ChangeInvisibleDurationResponse,
            ),
        }
    unknown = (
        pb.INTERNAL_SERVER_ERROR,
        "org.apache.rocketmq.proxy.common.ProxyException: cannot found transaction data",
    )
    assert {k: (a.status.code, a.status.message) for k, a in got.items()} == {
        "heartbeat": no_settings,
        "terminate": no_settings,
        "end unknown": unknown,
        "end garbage": unknown,
        "negative invisible": (
            pb.ILLEGAL_INVISIBLE_TIME,
            "the invisibleTime is too small. min is 0",
        ),
    }


def test_a_receive_before_the_clients_settings(
    broker5: Endpoint5, admin: RawClient, names: Callable[[str], str]
) -> None:
    """RocketMQ 5.3.3 reads the subscription off the client's Telemetry settings first: a
    receive before them fails with that NullPointerException's text (50001), even with a
    message waiting. idemp serves it with the group's own settings instead, on purpose:
    the official SimpleConsumer's startup does not wait for its settings, so its first
    receive can come before them (one start in ten or so, measured on both servers)
    and fails there. Either way the stream ends with the answer's time."""
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.send_message(topic, b"waiting").code == 0
    assert admin.indexed(topic, 0, 1) == 1
    _, request = simple_consumer(group, topic)
    request.long_polling_timeout.seconds = 5
    with closing(Raw(broker5.grpc_addr, client_id=names("raw-client@nosettings"))) as raw:
        answers = raw.stream("ReceiveMessage", request, pb.ReceiveMessageResponse)
    kinds = [a.WhichOneof("content") for a in answers]
    if broker5.real:
        assert kinds == ["status", "delivery_timestamp"]
        assert (answers[0].status.code, answers[0].status.message) == (
            pb.INTERNAL_SERVER_ERROR,
            'Cannot invoke "apache.rocketmq.v2.Settings.getSubscription()" because "settings"'
            " is null. NullPointerException. org.apache.rocketmq.proxy.grpc.v2.consumer."
            "ReceiveMessageActivity.receiveMessage(ReceiveMessageActivity.java:63)",
        )
    else:
        assert kinds == ["status", "message", "delivery_timestamp"]
        assert answers[0].status.code == pb.OK and answers[1].message.body == b"waiting"


def test_settings_refused_on_telemetry(
    raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """ClientActivity.processAndWriteClientSettings: the stream ends INVALID_ARGUMENT for
    settings with neither publishing nor subscription, a system topic to publish or an
    illegal group (as RocketMQ 5.3.3 ended it); an unknown topic is accepted."""
    failed = "process client telemetryCommand failed. "
    cases = {
        "neither": (pb.Settings(), "there is no publishing or subscription data in settings"),
        "system topic": (
            pb.Settings(
                client_type=pb.PRODUCER,
                publishing=pb.Publishing(topics=[resource("SCHEDULE_TOPIC_XXXX")]),
            ),
            failed + "cannot access system topic",
        ),
        "blank group": (
            pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription()),
            failed + "the specified group is blank",
        ),
    }
    for name, (settings, details) in cases.items():
        with pytest.raises(grpc.RpcError) as refused:
            raw.first_telemetry(settings)
        assert (refused.value.code(), refused.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            details,
        ), name
    unknown = pb.Settings(
        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[resource(names("Nope"))])
    )
    answer = raw.first_telemetry(unknown)
    assert (answer.WhichOneof("command"), answer.status.code) == ("settings", pb.OK)


def test_settings_of_a_client_type_the_server_does_not_know(
    broker5: Endpoint5, names: Callable[[str], str]
) -> None:
    """RocketMQ 5.3.3 cannot number such a client type: the Telemetry stream ends
    INTERNAL. (It keeps the settings all the same, and every later heartbeat of that
    client fails with the same exception's text, 50001; idemp keeps none, so a heartbeat
    gets 40015. The gRPC fuzzer found idemp's heartbeat failing on such settings:
    fuzz/regressions/grpc5.)"""
    with closing(Raw(broker5.grpc_addr, client_id=names("raw-client@odd"))) as raw:
        settings = pb.Settings(
            client_type=122, publishing=pb.Publishing(topics=[resource(names("T"))])
        )
        with pytest.raises(grpc.RpcError) as refused:
            raw.first_telemetry(settings)
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.INTERNAL,
        "process client telemetryCommand failed. Can't get the number of an unknown enum value.",
    )


def test_malformed_protobuf_and_unimplemented_rpcs(raw: Raw, broker5: Endpoint5) -> None:
    with pytest.raises(grpc.RpcError) as bad:
        raw.unary("QueryRoute", b"\xff\xff\xff\xff", pb.QueryRouteResponse)
    assert (bad.value.code(), bad.value.details()) == (grpc.StatusCode.UNKNOWN, "")
    for unserved in ("PullMessage", "UpdateOffset", "GetOffset", "QueryOffset"):
        with pytest.raises(grpc.RpcError) as missing:
            raw.unary(unserved, b"", pb.QueryRouteResponse)
        assert (missing.value.code(), missing.value.details()) == (
            grpc.StatusCode.UNIMPLEMENTED,
            f"Method apache.rocketmq.v2.MessagingService/{unserved} is unimplemented",
        )
    with pytest.raises(grpc.RpcError) as nothing:
        raw.unary("NoSuchMethod", b"", pb.QueryRouteResponse)
    assert (nothing.value.code(), nothing.value.details()) == (
        grpc.StatusCode.UNIMPLEMENTED,
        "Method not found: apache.rocketmq.v2.MessagingService/NoSuchMethod",
    )
    # and the server still answers
    answer = raw.unary(
        "QueryRoute", pb.QueryRouteRequest(topic=resource("NoSuchTopic_v5")), pb.QueryRouteResponse
    )
    assert answer.status.code == pb.TOPIC_NOT_FOUND


def test_transaction_data_is_the_message_id_taken_once_and_kept_for_a_while(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """The proxy's TransactionDataManager: every send answers the message's id as its
    transaction id; an EndTransaction takes the half's data, so a second finds none, and
    after ``transactionDataExpireMillis`` (30 s; 1 s here) it is gone (the check-back then
    resolves the half)."""
    broker = make_broker(transactionDataExpireMillis=1000)
    with RawClient(broker.broker_addr) as admin:
        assert admin.create_topic("TxN", 1, attributes="+message.type=NORMAL").code == 0
        assert admin.create_topic("TxT", 1, attributes="+message.type=TRANSACTION").code == 0
        raw = Raw(broker.grpc_addr)
        try:

            def send(topic: str, message_id: str, kind: int) -> Any:
                message = _message(topic)
                message.system_properties.message_id = message_id
                message.system_properties.message_type = kind
                request = pb.SendMessageRequest(messages=[message])
                answer = raw.unary("SendMessage", request, pb.SendMessageResponse)
                assert answer.status.code == pb.OK, answer.status
                return answer.entries[0]

            def end(message_id: str) -> tuple[int, str]:
                request = pb.EndTransactionRequest(
                    topic=resource("TxT"),
                    message_id=message_id,
                    transaction_id=message_id,
                    resolution=pb.COMMIT,
                    source=pb.SOURCE_CLIENT,
                )
                status = raw.unary("EndTransaction", request, pb.EndTransactionResponse).status
                return status.code, status.message

            normal = send("TxN", "0102FC00000001000000000000000000B1", pb.NORMAL)
            assert normal.transaction_id == "0102FC00000001000000000000000000B1"
            half = send("TxT", "0102FC00000001000000000000000000B2", pb.TRANSACTION)
            assert half.transaction_id == "0102FC00000001000000000000000000B2"
            assert end(half.transaction_id) == (pb.OK, "OK")
            none = (
                pb.INTERNAL_SERVER_ERROR,
                "org.apache.rocketmq.proxy.common.ProxyException: cannot found transaction data",
            )
            assert end(half.transaction_id) == none
            late = send("TxT", "0102FC00000001000000000000000000B3", pb.TRANSACTION)
            time.sleep(1.2)  # past the 1 s the data is kept
            assert end(late.transaction_id) == none
            assert [m.body for m in admin.pull_messages("TxT")] == [b"x"]  # B2 only
        finally:
            raw.close()


def test_the_brokers_own_topics_are_system_topics(raw: Raw) -> None:
    """TopicConfigManager adds its cluster's and its own name and the cluster's reply
    topic to TopicValidator's system topics at start, which the proxy then refuses."""
    for topic in ("DefaultCluster", "broker-a", "DefaultCluster_REPLY_TOPIC"):
        answer = raw.unary(
            "QueryRoute", pb.QueryRouteRequest(topic=resource(topic)), pb.QueryRouteResponse
        )
        assert (answer.status.code, answer.status.message) == (
            pb.ILLEGAL_TOPIC,
            "cannot access system topic",
        ), topic


NO_TOPIC_CONFIG = (
    'Cannot invoke "org.apache.rocketmq.common.TopicConfig.getPerm()" because "topicConfig" '
    "is null. NullPointerException. org.apache.rocketmq.proxy.service.route"
    ".LocalTopicRouteService.toTopicRouteData(LocalTopicRouteService.java:83)"
)
ILLEGAL = (
    "org.apache.rocketmq.proxy.common.ProxyException: the message is illegal, maybe msg body "
    "or properties length not matched. msg body length limit 4194304B, msg properties length "
    "limit 32KB."
)


def test_sends_the_broker_refuses_after_the_proxy_let_them_through(
    raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """A delivery time beyond protobuf's range (what a client sends given milliseconds)
    fails Timestamps.toMillis; INNER_NUM is the broker's (HookUtils.checkInnerBatch); the
    proxy sends several messages as one batch, which the store refuses transactional,
    and whose type it checks on the first message alone; a retry or DLQ topic's type is
    never checked, and one that does not exist fails the route look-up."""
    topic, delay, tx = names("T"), names("D"), names("X")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_topic(delay, 1, attributes="+message.type=DELAY").code == 0
    assert admin.create_topic(tx, 1, attributes="+message.type=TRANSACTION").code == 0
    in_ms = Timestamp(seconds=int(time.time() * 1000) + 60_000)
    soon = Timestamp(seconds=int(time.time()) + 60)
    cases = {
        "milliseconds": (
            [_message(delay, delivery_timestamp=in_ms)],
            pb.INTERNAL_SERVER_ERROR,
            "Timestamp is not valid. See proto definition for valid values. "
            f"Seconds ({in_ms.seconds}) must be in range [-62,135,596,800, +253,402,300,799]. "
            "Nanos (0) must be in range [0, +999,999,999].. IllegalArgumentException. "
            "com.google.protobuf.util.Timestamps.checkValid(Unknown Source)",
        ),
        "inner num": (
            [
                pb.Message(
                    topic=resource(topic),
                    body=b"x",
                    user_properties={"INNER_NUM": "2"},
                    system_properties=pb.SystemProperties(message_id="01"),
                )
            ],
            pb.INTERNAL_SERVER_ERROR,
            ILLEGAL,
        ),
        "two transactional": (
            [_message(tx, message_type=pb.TRANSACTION), _message(tx, message_type=pb.TRANSACTION)],
            pb.INTERNAL_SERVER_ERROR,
            ILLEGAL,
        ),
        "first delayed": (
            [_message(delay, delivery_timestamp=soon), _message(delay)],
            pb.OK,
            "OK",
        ),
        "unknown retry topic": (
            [_message("%RETRY%" + names("G"))],
            pb.INTERNAL_SERVER_ERROR,
            NO_TOPIC_CONFIG,
        ),
        "unknown dlq topic": (
            [_message("%DLQ%" + names("G"))],
            pb.INTERNAL_SERVER_ERROR,
            NO_TOPIC_CONFIG,
        ),
    }
    got, expected = {}, {}
    for name, (messages, code, text) in cases.items():
        answer = raw.unary(
            "SendMessage", pb.SendMessageRequest(messages=messages), pb.SendMessageResponse
        )
        got[name] = (answer.status.code, answer.status.message)
        expected[name] = (code, text)
    assert got == expected


def test_receives_the_pop_fails(raw: Raw, admin: RawClient, names: Callable[[str], str]) -> None:
    """A topic the broker lacks passes the proxy's name check and fails its route
    look-up; a negative batch size sizes the pop's list."""
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 1).code == 0
    cases = {
        names("Nope"): (1, NO_TOPIC_CONFIG),
        topic: (
            -1,
            "Illegal Capacity: -1. IllegalArgumentException. "
            "java.base/java.util.ArrayList.<init>(ArrayList.java:160)",
        ),
    }
    for name, (batch, words) in cases.items():
        settings, request = simple_consumer(group, name)
        assert raw.first_telemetry(settings).status.code == pb.OK
        request.batch_size = batch
        answers = raw.stream("ReceiveMessage", request, pb.ReceiveMessageResponse)
        statuses = [(a.status.code, a.status.message) for a in answers if a.HasField("status")]
        assert statuses == [(pb.INTERNAL_SERVER_ERROR, words)], name


def test_a_subscription_needs_a_consumer_client_type(raw: Raw, names: Callable[[str], str]) -> None:
    """ClientActivity.buildConsumeType: the stream ends INTERNAL."""
    for kind in (pb.PRODUCER, pb.CLIENT_TYPE_UNSPECIFIED, pb.PULL_CONSUMER):
        settings, _ = simple_consumer(names("G"), names("T"))
        settings.client_type = kind
        with pytest.raises(grpc.RpcError) as refused:
            raw.first_telemetry(settings)
        assert (refused.value.code(), refused.value.details()) == (
            grpc.StatusCode.INTERNAL,
            "process client telemetryCommand failed. Client type is not consumer, type: "
            + pb.ClientType.Name(kind),
        )


def test_an_ack_or_change_naming_a_queue_without_that_offset(
    raw: Raw, admin: RawClient, broker5: Endpoint5, names: Callable[[str], str]
) -> None:
    """The broker's ack (offset above the queue's max) and change (at its max too)
    answer NO_MESSAGE, an abnormal status to the proxy."""
    topic, other, group = names("T"), names("O"), names("G")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_topic(other, 1).code == 0
    for body in (b"first", b"second"):
        assert admin.send_message(topic, body).code == 0
    admin.indexed(topic, 0, 2)
    for _ in range(2):  # the second message's handle: queue offset 1, above other's max 0
        message = raw.receive_one(group, topic, invisible_s=broker5.invisible_s * 10)
    handle = message.system_properties.receipt_handle
    assert raw.ack(group, other, handle) == (
        pb.INTERNAL_SERVER_ERROR,
        "INTERNAL_SERVER_ERROR",
        [(pb.INTERNAL_SERVER_ERROR, "ack failed: status is abnormal")],
    )
    assert raw.change(group, other, handle) == (
        pb.INTERNAL_SERVER_ERROR,
        "changeInvisibleDuration failed: status is abnormal",
    )
    assert raw.ack(group, topic, handle)[0] == pb.OK


def test_a_receives_tag_expression_is_parsed_as_filter_api_parses_it(
    raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """The proxy's FilterAPI.build: "||" splits into nothing (ILLEGAL_FILTER_EXPRESSION,
    its words), " " names no tag and so matches no message; "" is every tag."""
    topic = names("T")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.send_message(topic, b"tagged", {"TAGS": "a"}).code == 0
    admin.indexed(topic, 0, 1)
    seen = {}
    for n, expression in enumerate(("||", " ", "")):
        group = names(f"G{n}")
        settings, request = simple_consumer(group, topic)
        assert raw.first_telemetry(settings).status.code == pb.OK
        request.filter_expression.expression = expression
        request.long_polling_timeout.seconds = 5
        answers = raw.stream("ReceiveMessage", request, pb.ReceiveMessageResponse)
        statuses = [(a.status.code, a.status.message) for a in answers if a.HasField("status")]
        bodies = [a.message.body for a in answers if a.WhichOneof("content") == "message"]
        seen[expression] = (statuses[0][0], bodies)
        if expression == "||":
            assert statuses == [(pb.ILLEGAL_FILTER_EXPRESSION, "subString split error")]
    assert seen == {
        "||": (pb.ILLEGAL_FILTER_EXPRESSION, []),
        " ": (pb.MESSAGE_NOT_FOUND, []),
        "": (pb.OK, [b"tagged"]),
    }
