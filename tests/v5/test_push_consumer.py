"""The official RocketMQ 5 PushConsumer against idemp's gRPC endpoint.

Measured on RocketMQ 5.3.3 (../shared/realrmq5); IDEMP_V5_REAL runs the file against it.
"""

from __future__ import annotations

from collections.abc import Callable

from idemp.remoting.msgid import parse_offset_msg_id
from idemp.tools import dlq
from tests.broker.rawclient import RawClient

from .conftest import Client5, Endpoint5, dead_letters


def test_failure_is_retried_then_dead_lettered(
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
    client.ok("push", name="c", group=group, subs={topic: "*"}, fail=["bad"])
    client.ok(
        "send",
        name="p",
        messages=[{"topic": topic, "body": b} for b in ("good-1", "bad", "good-2")],
    )
    calls = client.ok("wait_push", name="c", count=4, within=90, timeout=120)["calls"]
    assert sorted(c["body"] for c in calls if c["result"] == "SUCCESS") == ["good-1", "good-2"]
    bad = [c for c in calls if c["body"] == "bad"]
    assert [c["delivery_attempt"] for c in bad] == [1, 2]
    found = dead_letters(broker5.broker_addr, group, 1, 30)
    assert [m.body for m in found] == [b"bad"]
    # sent back by the proxy as a 4.x consumer's send-back is: from the POP retry copy it
    # was last delivered as (its offset id), no delay (as on RocketMQ 5.3.3)
    (dead,) = found
    assert dead.properties["RETRY_TOPIC"] == f"%RETRY%{group}_{topic}"
    assert dead.properties["DELAY"] == "0"
    assert parse_offset_msg_id(dead.properties["ORIGIN_MESSAGE_ID"])[1] < dead.commit_log_offset


def test_a_dead_letter_replayed_comes_back_to_its_group(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    """``idemp dlq replay`` for a RocketMQ 5 group: POP reads ``%RETRY%<group>_<topic>``,
    not a 4.x group's ``%RETRY%<group>``, so that is where the replay goes (measured on
    RocketMQ 5.3.3 too, where the dead letter names that topic in RETRY_TOPIC)."""
    assert broker5.namesrv_addr, "IDEMP_V5_REAL needs the nameserver as a third address"
    topic, group = names("T"), names("G")
    assert admin.create_topic(topic, 4).code == 0
    assert admin.create_group(group, retryMaxTimes=1).code == 0
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("push", name="c", group=group, subs={topic: "*"}, fail=["bad"])
    client.ok("send", name="p", messages=[{"topic": topic, "body": "bad", "keys": ["k"]}])
    client.ok("wait_push", name="c", count=2, within=90, timeout=120)
    dead_letters(broker5.broker_addr, group, 1, 60)
    client.ok("shutdown", name="c")

    ((offset, letter),) = dlq.dead_letters(broker5.namesrv_addr, group)
    assert dlq.retry_route(letter, group) == (f"%RETRY%{group}_{topic}", topic)
    ((_, sent),) = dlq.replay(broker5.namesrv_addr, group, [letter])
    assert sent.queue.topic == f"%RETRY%{group}_{topic}"
    client.ok("push", name="fixed", group=group, subs={topic: "*"})
    (call,) = client.ok("wait_push", name="fixed", count=1, within=90, timeout=120)["calls"]
    assert (call["topic"], call["body"], call["keys"], call["delivery_attempt"]) == (
        topic,
        "bad",
        ["k"],
        1,
    )
    assert call["message_id"] == letter.uniq_key


def test_fifo_group_waits_for_its_failing_message(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    topic, group = names("F"), names("GF")
    assert admin.create_topic(topic, 4, attributes="+message.type=FIFO").code == 0
    assert admin.create_group(group, consumeMessageOrderly=True, retryMaxTimes=2).code == 0
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("push", name="c", group=group, subs={topic: "*"}, fail=["a-1"])
    client.ok(
        "send",
        name="p",
        messages=[
            {"topic": topic, "body": f"{g}-{i}", "message_group": g}
            for g in ("a", "b")
            for i in range(3)
        ],
    )
    calls = client.ok("wait_push", name="c", count=8, within=90, timeout=120)["calls"]
    a = [c["body"] for c in calls if c["message_group"] == "a"]
    b = [c["body"] for c in calls if c["message_group"] == "b"]
    assert b == ["b-0", "b-1", "b-2"]
    assert a == ["a-0", "a-1", "a-1", "a-1", "a-2"]
    found = dead_letters(broker5.broker_addr, group, 1, 30)
    assert [m.body for m in found] == [b"a-1"]
