"""Delay, transactions and the dead-letter queue with the official RocketMQ 5 client.

Measured on RocketMQ 5.3.3 (../shared/realrmq5); the same file runs against it with
IDEMP_V5_REAL. Waits are bounded by what RocketMQ 5 itself takes (its transaction check
runs every 30 s, its revive scan lags up to ~5 s).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

from idemp.broker.v5.schema import pb
from idemp.remoting.codes import RequestCode
from tests.broker.rawclient import RawClient

from .conftest import Client5, Endpoint5, dead_letters
from .raw import Raw, simple_consumer

INVISIBLE_S = 10
PROXY = "org.apache.rocketmq.proxy.common.ProxyException: "


def test_delivery_time_is_kept(
    admin: RawClient, client5: Callable[[], Client5], names: Callable[[str], str]
) -> None:
    topic, group = names("D"), names("G")
    assert admin.create_topic(topic, 4, attributes="+message.type=DELAY").code == 0
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("simple", name="c", group=group, subs={topic: "*"}, **{"await": 5})
    target_s = int(time.time()) + 4  # the 5.1.2 client takes epoch seconds on send
    client.ok(
        "send",
        name="p",
        messages=[{"topic": topic, "body": "later", "delivery_timestamp": target_s}],
    )
    got = client.receive_until(1, 30)
    assert [m["body"] for m in got] == ["later"]
    assert got[0]["delivery_timestamp"] == target_s * 1000  # and reports milliseconds
    assert got[0]["wall"] >= target_s
    assert got[0]["wall"] < target_s + 3
    # as a 4.x pull sees it, with what RocketMQ 5.3.3's timer wheel writes (measured):
    # its slot (a time on a second's edge belongs to the second before), the wheel's
    # time it entered at (whole seconds), and when it left
    (pulled,) = [m for q in range(4) for m in admin.pull_messages(topic, q)]
    props = pulled.properties
    assert props["TIMER_DELIVER_MS"] == str(target_s * 1000)
    assert props["TIMER_OUT_MS"] == str(target_s * 1000 - 1000)
    entered, left = int(props["TIMER_ENQUEUE_MS"]), int(props["TIMER_DEQUEUE_MS"])
    assert entered % 1000 == 0 and target_s * 1000 - 6000 <= entered < target_s * 1000
    assert target_s * 1000 <= left < target_s * 1000 + 3000
    assert (props["REAL_TOPIC"], pulled.topic) == (topic, topic)


def test_transaction_commit_rollback_and_check(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    topic, group = names("X"), names("G")
    assert admin.create_topic(topic, 4, attributes="+message.type=TRANSACTION").code == 0
    client = client5()
    client.ok("producer", name="p", topics=[topic], check="COMMIT")
    client.ok("simple", name="c", group=group, subs={topic: "*"}, **{"await": 5})
    committed = client.ok(
        "send_tx", name="p", message={"topic": topic, "body": "commit"}, end="commit"
    )
    client.ok("send_tx", name="p", message={"topic": topic, "body": "rollback"}, end="rollback")
    unresolved = client.ok(
        "send_tx", name="p", message={"topic": topic, "body": "ask me"}, end="none"
    )
    first = client.receive_until(1, 30)
    assert [(m["body"], m["message_id"]) for m in first] == [("commit", committed["message_id"])]
    # RocketMQ 5.3.3's broker names the transaction in the message, and its proxy hands
    # that back as a user property (measured)
    assert first[0]["properties"] == {"__transactionId__": committed["message_id"]}
    client.ok("ack", name="c", ref=first[0]["ref"])
    # the half left open is resolved by asking the producer's checker (COMMIT), in the
    # first round after it is 6 s old (transactionTimeOut): RocketMQ 5.3.3's rounds are
    # 30 s apart (4.9.7's, which idemp keeps for 4.x halves, 60 s)
    later = client.receive_until(1, 45)
    assert [(m["body"], m["message_id"]) for m in later] == [("ask me", unresolved["message_id"])]
    checks = client.ok("checks")["checks"]
    assert [c["message_id"] for c in checks][:1] == [unresolved["message_id"]]
    # the rolled-back message never shows up
    client.ok("ack", name="c", ref=later[0]["ref"])
    assert client.ok("receive", name="c", max=16, invisible=INVISIBLE_S)["messages"] == []


def test_dead_letter_queue_after_the_last_attempt(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 4).code == 0
    assert admin.create_group(group, retryMaxTimes=1).code == 0
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("simple", name="c", group=group, subs={topic: "*"}, **{"await": 5})
    sent = client.ok(
        "send", name="p", messages=[{"topic": topic, "body": "poison", "keys": ["p1"]}]
    )["receipts"][0]
    inv = broker5.invisible_s
    attempts = []
    for _ in range(2):
        got = client.receive_until(1, inv + 20, inv)
        assert [m["body"] for m in got] == ["poison"]
        attempts.append(got[0]["delivery_attempt"])
    assert attempts == [1, 2]
    # retryMaxTimes 1: two deliveries, then %DLQ%<group>, where a 4.x pull finds it. The
    # server moves it there when it would hand it out a third time, so receives go on
    # (and find nothing) until it shows up in the DLQ.
    dlq = f"%DLQ%{group}"
    deadline = time.monotonic() + inv + 30
    found: list[Any] = []
    with RawClient(broker5.broker_addr) as remoting:
        while not found and time.monotonic() < deadline:
            assert client.ok("receive", name="c", max=16, invisible=inv)["messages"] == []
            found = remoting.pull_messages(dlq, 0)
    assert [m.body for m in found] == [b"poison"]
    assert found[0].properties["UNIQ_KEY"] == sent["message_id"]
    assert found[0].properties["KEYS"] == "p1"
    # as RocketMQ 5.3.3 writes them (measured): the dead letter names the topic of the
    # copy that was due a third time, the POP retry topic, with one more reconsume; the
    # retry copies themselves name no topic
    assert found[0].properties["RETRY_TOPIC"] == f"%RETRY%{group}_{topic}"
    assert found[0].reconsume_times == 3
    with RawClient(broker5.broker_addr) as remoting:
        retries = remoting.pull_messages(f"%RETRY%{group}_{topic}", 0)
    assert [m.reconsume_times for m in retries] == [1, 2]
    assert not [m for m in retries if "RETRY_TOPIC" in m.properties]


def _broker_config(admin: RawClient, **values: str) -> None:
    body = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
    assert admin.request(RequestCode.UPDATE_BROKER_CONFIG, {}, body).code == 0


def test_a_recalled_delay_message_is_never_delivered(
    admin: RawClient, client5: Callable[[], Client5], names: Callable[[str], str]
) -> None:
    """RecallMessage as RocketMQ 5.3.3 answers it (measured there with this client):
    refused while the broker's recallMessageEnable is false, its default; once on, the
    recalled message never arrives and the other one does."""
    topic, normal, group = names("D"), names("N"), names("G")
    assert admin.create_topic(topic, 4, attributes="+message.type=DELAY").code == 0
    assert admin.create_topic(normal, 4, attributes="+message.type=NORMAL").code == 0
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("simple", name="c", group=group, subs={topic: "*"}, **{"await": 5})
    target_s = int(time.time()) + 5
    sent = client.ok(
        "send",
        name="p",
        messages=[
            {"topic": topic, "body": body, "delivery_timestamp": target_s}
            for body in ("recalled", "kept")
        ]
        + [{"topic": topic, "body": "due", "delivery_timestamp": int(time.time()) - 5}],
    )["receipts"]
    recalled, kept, due = sent
    # v1 <topic> <broker> <the timer slot + 1> <message id>: a whole second's slot is the
    # second before it
    items = base64.urlsafe_b64decode(recalled["recall_handle"]).decode().split(" ")
    assert items[0] == "v1" and items[1] == topic and items[4] == recalled["message_id"]
    assert int(items[3]) == target_s * 1000 - 999
    assert kept["recall_handle"] and due["recall_handle"] is None  # not parked: none
    forbidden = client.call("recall", name="p", topic=topic, handle=recalled["recall_handle"])
    assert (forbidden["code"], forbidden["message"]) == (
        50001,
        f"50001, {PROXY}recall failed, operation is forbidden",
    )
    invalid = client.call("recall", name="p", topic=topic, handle="not a handle")
    assert (invalid["code"], invalid["message"]) == (
        50001,
        f"50001, {PROXY}recall handle is invalid",
    )
    wrong = client.call("recall", name="p", topic=normal, handle=recalled["recall_handle"])
    assert wrong["code"] == 40014
    assert wrong["message"].endswith("the expected type is NORMAL, but actual type is DELAY")
    _broker_config(admin, recallMessageEnable="true")
    try:
        answer = client.ok("recall", name="p", topic=topic, handle=recalled["recall_handle"])
        assert answer["message_id"] == recalled["message_id"]
        # a second recall of the same handle is accepted too, as on RocketMQ
        client.ok("recall", name="p", topic=topic, handle=recalled["recall_handle"])
        other = base64.urlsafe_b64encode(
            " ".join([*items[:2], "no-such-broker", *items[3:]]).encode()
        )
        refused = client.call("recall", name="p", topic=topic, handle=other.decode())
        assert refused["message"] == f"50001, {PROXY}recall failed, broker service not available"
        # receive until well past the delivery time: "due" at once, "kept" at its time,
        # "recalled" never (both were due in the same timer second)
        got = client.receive_until(3, target_s + 6 - time.time(), invisible=30)
    finally:
        _broker_config(admin, recallMessageEnable="false")
    assert sorted(m["body"] for m in got) == ["due", "kept"]


def test_a_4x_namespaced_topic_as_a_5x_client_receives_it(
    raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """A 4.x client with a namespace stores ``ns%Topic``; RocketMQ 5.3.3's proxy names it
    to a 5.x client as namespace ``ns``, topic ``Topic`` (GrpcConverter.buildResource).
    An ack naming that topic, as the official client's does, finds no such topic; the
    stored name acks."""
    plain = names("T")
    topic, group = f"ns1%{plain}", names("G")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_group(group).code == 0
    assert admin.send_message(topic, b"from-4x", {"KEYS": "k1"}).code == 0
    message = raw.receive_one(group, topic)
    assert (message.topic.resource_namespace, message.topic.name) == ("ns1", plain)
    assert message.body == b"from-4x"
    handle = message.system_properties.receipt_handle
    message_id = message.system_properties.message_id
    assert raw.change(group, plain, handle, message_id, seconds=30) == (
        pb.INTERNAL_SERVER_ERROR,
        "changeInvisibleDuration failed: status is abnormal",
    )
    assert raw.ack(group, plain, handle, message_id) == (
        pb.INTERNAL_SERVER_ERROR,
        "INTERNAL_SERVER_ERROR",
        [(pb.INTERNAL_SERVER_ERROR, "ack failed: status is abnormal")],
    )
    assert raw.ack(group, topic, handle, message_id) == (pb.OK, "OK", [(pb.OK, "OK")])


def test_forwarding_to_the_dlq_sends_the_handles_message_back_whatever_the_names(
    raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """ForwardMessageToDeadLetterQueue (the 5.x PushConsumer's FIFO give-up): RocketMQ
    5.3.3's proxy checks the names' syntax only, sends the handle's message back to the
    named group's DLQ, then acks it (quietly failing for a topic it lacks). Its answer is
    the send-back's: OK, "0". The dead letter carries where it came from, as a 4.x
    send-back's does."""
    topic, group, other = names("T"), names("G"), names("OtherG")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_group(group).code == 0
    sent = admin.send_message(topic, b"dead", {"KEYS": "kd"})
    assert sent.code == 0
    message = raw.receive_one(group, topic)

    def forward(group_name: str, topic_name: str) -> tuple[int, str]:
        handle = message.system_properties.receipt_handle
        return raw.forward(group_name, topic_name, handle, message.system_properties.message_id)

    assert forward(group, names("NoSuchT")) == (pb.OK, "0")
    assert forward(other, topic) == (pb.OK, "0")  # a group is created on first use
    assert forward(group, topic) == (pb.OK, "0")
    ours, others = (
        dead_letters(admin.addr, group, 2, 10.0),
        dead_letters(admin.addr, other, 1, 10.0),
    )
    assert (len(ours), len(others)) == (2, 1)
    for dead in ours + others:
        assert (dead.body, dead.reconsume_times) == (b"dead", 1)
        assert dead.properties["RETRY_TOPIC"] == topic
        assert dead.properties["ORIGIN_MESSAGE_ID"] == sent.ext_fields["msgId"]
        assert dead.properties["DELAY"] == "0"
    # the broker's send-back made each group's 4.x retry topic first, as on 5.3.3
    assert {f"%RETRY%{group}", f"%RETRY%{other}"} <= admin.topic_names()


def test_an_expired_handle_still_sends_its_message_to_the_dlq(
    broker5: Endpoint5, raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """The proxy's forward checks no expiry, only that the handle has the commit log
    offset of its message (the message is delivered again too: the ack after the send
    back fails on the expired handle, quietly)."""
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_group(group).code == 0
    assert admin.send_message(topic, b"late").code == 0
    message = raw.receive_one(group, topic, invisible_s=broker5.invisible_s)
    time.sleep(broker5.invisible_s + 0.5)  # the handle's time runs out
    handle, message_id = (
        message.system_properties.receipt_handle,
        message.system_properties.message_id,
    )
    assert raw.forward(group, topic, handle, message_id) == (pb.OK, "0")
    assert [m.body for m in dead_letters(admin.addr, group, 1, 10.0)] == [b"late"]


def test_a_receive_reads_the_retry_topic_first_as_often_as_the_broker_says(
    broker5: Endpoint5, raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """PopMessageProcessor: popFromRetryProbability percent of the receives (20 by
    default) read the POP retry topic first, the others the topic's queues, the retry
    topic only filling the rest. At 0 and at 100 the order is certain."""
    inv = broker5.invisible_s
    for percent, first in ((100, b"retried"), (0, b"new")):
        assert admin.update_broker_config(popFromRetryProbability=percent).code == 0
        topic, group = names(f"T{percent}"), names(f"G{percent}")
        assert admin.create_topic(topic, 1).code == 0
        assert admin.create_group(group).code == 0
        assert admin.send_message(topic, b"retried").code == 0
        admin.indexed(topic, 0, 1)
        assert raw.receive_one(group, topic, invisible_s=inv).body == b"retried"  # not acked
        assert admin.send_message(topic, b"new").code == 0
        admin.indexed(topic, 0, 2)
        # revived: its copy in the POP retry topic (RocketMQ's revive lags some seconds)
        retry = f"%RETRY%{group}_{topic}"
        assert admin.indexed(retry, 0, 1, within=inv + 30) == 1
        settings, request = simple_consumer(group, topic)
        request.invisible_duration.seconds = 60
        answers = raw.stream("ReceiveMessage", request, pb.ReceiveMessageResponse)
        got = [a.message.body for a in answers if a.WhichOneof("content") == "message"]
        assert got == [first], percent
    assert admin.update_broker_config(popFromRetryProbability=20).code == 0


def test_a_revived_message_waits_for_the_held_receive_to_end(
    broker5: Endpoint5, raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """A receive held in its long poll is woken by a new message on its topic, not by a
    message revived into the retry topic (PopLongPollingService notifies the topic the
    message was written to, and a receive waits on its own): the retry is handed out when
    the poll's time ends. A PushConsumer, polling 20 s, so sees a failed message again
    20 s later whatever its backoff asked (measured on 5.3.3: 20.3 s and 40.3 s)."""
    inv = broker5.invisible_s
    poll_s = 20 if broker5.real else inv + 6  # the real revive lags up to ~5 s
    topic, group = names("THeld"), names("GHeld")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_group(group).code == 0
    assert admin.send_message(topic, b"again").code == 0
    admin.indexed(topic, 0, 1)
    assert raw.receive_one(group, topic, invisible_s=inv).body == b"again"  # not acked
    settings, request = simple_consumer(group, topic)
    request.invisible_duration.seconds = 60
    request.long_polling_timeout.seconds = poll_s
    started = time.monotonic()
    answers = raw.stream("ReceiveMessage", request, pb.ReceiveMessageResponse)
    held = time.monotonic() - started
    retry = f"%RETRY%{group}_{topic}"
    assert admin.indexed(retry, 0, 1, within=1) == 1  # revived while the receive waited
    got = [(a.message.body, a.message.system_properties.delivery_attempt) for a in answers
           if a.WhichOneof("content") == "message"]  # fmt: skip
    assert got == [(b"again", 2)]
    assert held >= poll_s - 0.5, held


def test_a_group_that_may_not_consume_receives_nothing(
    broker5: Endpoint5, raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """consumeEnable=false (mqadmin updateSubGroup -s false): PopMessageProcessor refuses
    with NO_PERMISSION, which the proxy answers 50001; the message stays for later."""
    topic, group = names("TOff"), names("GOff")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_group(group, consumeEnable=False).code == 0
    assert admin.send_message(topic, b"kept").code == 0
    admin.indexed(topic, 0, 1)
    settings, request = simple_consumer(group, topic)
    assert raw.first_telemetry(settings).status.code == pb.OK
    request.long_polling_timeout.seconds = 5
    answers = raw.stream("ReceiveMessage", request, pb.ReceiveMessageResponse)
    assert (answers[0].status.code, answers[0].status.message) == (
        pb.INTERNAL_SERVER_ERROR,
        f"{PROXY}subscription group no permission, {group}",
    )
    assert admin.create_group(group, consumeEnable=True).code == 0
    assert raw.receive_one(group, topic, invisible_s=broker5.invisible_s).body == b"kept"


def _receive_all(raw: Raw, group: str, topic: str) -> list[tuple[bytes, int]]:
    """One receive of up to 32 messages: (body, delivery attempt) each, acked."""
    settings, request = simple_consumer(group, topic)
    assert raw.first_telemetry(settings).status.code == pb.OK
    request.batch_size = 32
    request.long_polling_timeout.seconds = 5
    answers = raw.stream("ReceiveMessage", request, pb.ReceiveMessageResponse)
    got = []
    for a in answers:
        if a.WhichOneof("content") == "message":
            props = a.message.system_properties
            assert raw.ack(group, topic, props.receipt_handle, props.message_id)[0] == pb.OK
            got.append((a.message.body, props.delivery_attempt))
    return got


def test_a_receive_counts_from_the_offset_an_admin_set(
    broker5: Endpoint5, raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """A pop reads the group's committed offset each time, so a group deleted with its
    offsets (mqadmin deleteSubGroup -r: RocketMQ 5's cleanOffset, 4.9.7's removeOffset)
    or an offset set back starts there again: the queue still holds its first message,
    so from it (initPopOffsetByCheckMsgInMem), what was acked comes again."""
    topic, group = names("TReset"), names("GReset")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_group(group).code == 0
    assert admin.send_message(topic, b"d0").code == 0
    admin.indexed(topic, 0, 1)
    assert _receive_all(raw, group, topic) == [(b"d0", 1)]
    deleted = admin.request(
        RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": group, "cleanOffset": "true"}
    )
    assert deleted.code == 0
    assert admin.send_message(topic, b"d1").code == 0
    admin.indexed(topic, 0, 2)
    assert _receive_all(raw, group, topic) == [(b"d0", 1), (b"d1", 1)]
    reset = {"consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": 1}
    assert admin.request(RequestCode.UPDATE_CONSUMER_OFFSET, reset).code == 0
    assert _receive_all(raw, group, topic) == [(b"d1", 1)]


def test_a_4x_messages_born_host_is_its_address_without_the_port(
    broker5: Endpoint5, raw: Raw, admin: RawClient, names: Callable[[str], str]
) -> None:
    """A 4.x producer sets no __BORNHOST: the proxy gives getBornHostString(), the IP."""
    topic, group = names("TBorn"), names("GBorn")
    assert admin.create_topic(topic, 1).code == 0
    assert admin.create_group(group).code == 0
    assert admin.send_message(topic, b"from 4.x").code == 0
    admin.indexed(topic, 0, 1)
    message = raw.receive_one(group, topic, invisible_s=broker5.invisible_s)
    assert message.system_properties.born_host == "127.0.0.1"
