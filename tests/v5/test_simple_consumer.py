"""The official RocketMQ 5 client's Producer and SimpleConsumer against idemp's gRPC endpoint.

Each expectation was measured on RocketMQ 5.3.3 with its proxy (../shared/realrmq5); run
the file against it with IDEMP_V5_REAL=127.0.0.1:18081,127.0.0.1:20911.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.broker.rawclient import RawClient

from .conftest import Client5, Endpoint5

# A message not acked comes back once its invisible time is over; RocketMQ's revive scan
# runs behind by up to ~5 s (measured 12.5–15 s for 10 s), idemp's by up to 0.5 s.
REVIVE_SLACK_S = 10


def _ready(
    admin: RawClient, topic: str, group: str, *, attributes: str = "", **group_fields: Any
) -> None:
    assert admin.create_topic(topic, 4, attributes=attributes).code == 0
    assert admin.create_group(group, **group_fields).code == 0


def _consumer(client: Client5, group: str, topic: str, expression: str = "*") -> None:
    client.ok("simple", name="c", group=group, subs={topic: expression}, **{"await": 5})


def test_send_and_receive_keys_tags_properties(
    admin: RawClient, client5: Callable[[], Client5], names: Callable[[str], str]
) -> None:
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    sent = [
        {
            "topic": topic,
            "body": f"body-{i}",
            "tag": "TagA",
            "keys": [f"k{i}", "order"],
            "properties": {"color": "red", "n": str(i)},
        }
        for i in range(3)
    ]
    receipts = client.ok("send", name="p", messages=sent)["receipts"]
    _consumer(client, group, topic, "TagA")
    got = client.receive_until(3, 30)
    assert len(got) == 3
    by_body = {m["body"]: m for m in got}
    for i, receipt in enumerate(receipts):
        m = by_body[f"body-{i}"]
        assert m["message_id"] == receipt["message_id"]
        assert m["topic"] == topic
        assert m["tag"] == "TagA"
        assert m["keys"] == sorted([f"k{i}", "order"])
        assert m["properties"] == {"color": "red", "n": str(i)}
        assert m["delivery_attempt"] == 1
        assert m["message_group"] is None
    for m in got:
        client.ok("ack", name="c", ref=m["ref"])


def test_a_receive_of_more_than_32_gets_32(
    admin: RawClient, client5: Callable[[], Client5], names: Callable[[str], str]
) -> None:
    """The proxy caps a receive at 32 messages (ProxyUtils.MAX_MSG_NUMS_FOR_POP_REQUEST);
    measured on RocketMQ 5.3.3: 64 asked with 80 stored, 32 came."""
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("send", name="p", messages=[{"topic": topic, "body": f"m{i}"} for i in range(40)])
    _consumer(client, group, topic, "*")
    # the first receive that finds messages: all 40 are stored, so it is capped
    assert len(client.receive_until(1, 30, invisible=30, max=64)) == 32


def test_tag_filter_skips_other_tags(
    admin: RawClient, client5: Callable[[], Client5], names: Callable[[str], str]
) -> None:
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok(
        "send",
        name="p",
        messages=[
            {"topic": topic, "body": b, "tag": t} for b, t in (("a", "A"), ("b", "B"), ("c", "C"))
        ],
    )
    _consumer(client, group, topic, "A || C")
    got = client.receive_until(2, 30)
    assert sorted(m["body"] for m in got) == ["a", "c"]


def test_unacked_message_comes_back_with_the_next_attempt(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    inv = broker5.invisible_s
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("send", name="p", messages=[{"topic": topic, "body": "once"}])
    _consumer(client, group, topic)
    first = client.receive_until(1, 30, inv)
    assert [m["body"] for m in first] == ["once"]
    assert first[0]["delivery_attempt"] == 1
    again = client.receive_until(1, inv + REVIVE_SLACK_S + 5, inv)
    assert [m["body"] for m in again] == ["once"]
    assert again[0]["message_id"] == first[0]["message_id"]
    assert again[0]["delivery_attempt"] == 2
    assert again[0]["at"] - first[0]["asked"] >= inv  # asked before the pop began it
    # the first delivery's handle is no longer valid: 40013 INVALID_RECEIPT_HANDLE
    late = client.call("ack", name="c", ref=first[0]["ref"])
    assert (late["ok"], late["code"], late["message"]) == (
        False,
        40013,
        "40013, INVALID_RECEIPT_HANDLE",
    )
    client.ok("ack", name="c", ref=again[0]["ref"])


def test_invisible_time_under_the_minimum_is_refused(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    client = client5()
    _consumer(client, group, topic)
    answer = client.call("receive", name="c", max=16, invisible=1)
    assert not answer["ok"]
    assert answer["code"] == 40011
    minimum = broker5.invisible_s * 1000  # 10000 by default (test_endpoint.py checks it)
    assert f"the invisibleTime is too small. min is {minimum}" in answer["message"]


def test_a_4x_and_a_5x_client_see_each_others_messages(
    broker5: Any, admin: RawClient, client5: Callable[[], Client5], names: Callable[[str], str]
) -> None:
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    with RawClient(broker5.broker_addr) as remoting:
        sent = remoting.send_message(
            topic,
            b"from-4x",
            {
                "TAGS": "T4",
                "KEYS": "a b",
                "UNIQ_KEY": "AC110001000018B4AAC2000000000001",
                "color": "blue",
            },
            queue_id=1,
        )
        assert sent.code == 0, sent.remark
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    receipt = client.ok(
        "send",
        name="p",
        messages=[
            {
                "topic": topic,
                "body": "from-5x",
                "tag": "T5",
                "keys": ["c"],
                "properties": {"size": "L"},
            }
        ],
    )["receipts"][0]
    _consumer(client, group, topic)
    got = {m["body"]: m for m in client.receive_until(2, 30)}
    assert set(got) == {"from-4x", "from-5x"}
    m4 = got["from-4x"]
    assert (m4["message_id"], m4["tag"], m4["keys"], m4["properties"]) == (
        "AC110001000018B4AAC2000000000001",
        "T4",
        ["a", "b"],
        {"color": "blue"},
    )
    # the 5.x message as a 4.x pull sees it
    with RawClient(broker5.broker_addr) as remoting:
        pulled = [m for q in range(4) for m in remoting.pull_messages(topic, q)]
    m5 = next(m for m in pulled if m.body == b"from-5x")
    assert m5.properties["UNIQ_KEY"] == receipt["message_id"]
    assert m5.properties["TAGS"] == "T5"
    assert m5.properties["KEYS"] == "c"
    assert m5.properties["size"] == "L"
    # stored with the broker's region and trace switch (RocketMQ 5.3.3; 4.9.7 does not)
    assert (m5.properties["MSG_REGION"], m5.properties["TRACE_ON"]) == ("DefaultRegion", "true")
    assert m5.properties["CLUSTER"] == "DefaultCluster"


def test_change_invisible_duration(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    inv = broker5.invisible_s
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("send", name="p", messages=[{"topic": topic, "body": "slow"}])
    _consumer(client, group, topic)
    first = client.receive_until(1, 30, 30)
    assert [m["body"] for m in first] == ["slow"]
    changed_at = time.monotonic()
    client.ok("change", name="c", ref=first[0]["ref"], invisible=inv)
    again = client.receive_until(1, inv + REVIVE_SLACK_S + 5, inv)
    assert [m["body"] for m in again] == ["slow"]
    assert again[0]["at"] - changed_at >= inv
    assert again[0]["delivery_attempt"] == 2  # the change itself is not a delivery
    # the client moved the message to the handle the change returned, whose time is up
    stale = client.call("ack", name="c", ref=first[0]["ref"])
    assert (stale["ok"], stale["code"], stale["message"]) == (
        False,
        40013,
        "40013, INVALID_RECEIPT_HANDLE",
    )
    client.ok("ack", name="c", ref=again[0]["ref"])


def test_acking_twice_is_accepted(
    admin: RawClient, client5: Callable[[], Client5], names: Callable[[str], str]
) -> None:
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    client.ok("send", name="p", messages=[{"topic": topic, "body": "x"}])
    _consumer(client, group, topic)
    first = client.receive_until(1, 30, 30)
    client.ok("ack", name="c", ref=first[0]["ref"])
    client.ok("ack", name="c", ref=first[0]["ref"])


def test_sql92_filter(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    """A FilterExpression of type SQL92, served by RocketMQ 5.3.3's POP whatever the
    broker's enablePropertyFilter (measured on 5.3.3 with its default, false): only
    messages whose properties match are received, with the selector's conversion rules
    (``a > 5`` reads ``a`` as an integer, so ``10.5`` is not received; ``a > 5.0`` reads a
    double); an expression that does not compile fails each receive with 50001."""
    topic, group = names("T"), names("G")
    _ready(admin, topic, group)
    client = client5()
    client.ok("producer", name="p", topics=[topic])
    sent = [
        {"topic": topic, "body": f"a={a}", "properties": {} if a is None else {"a": a}}
        for a in ["3", "10", "7", "x", "10.5", None]
    ]
    client.ok("send", name="p", messages=sent)
    client.ok("simple", name="c", group=group, subs={topic: "a > 5"}, sql=True, **{"await": 5})
    got = client.receive_until(2, 30, broker5.invisible_s)
    assert sorted(m["body"] for m in got) == ["a=10", "a=7"]
    client.ok("simple", name="d", group=names("G2"), subs={topic: "a > 5.0"}, sql=True)
    got = client.receive_until(3, 30, broker5.invisible_s, name="d")
    assert sorted(m["body"] for m in got) == ["a=10", "a=10.5", "a=7"]
    client.ok("simple", name="bad", group=names("G3"), subs={topic: "a >"}, sql=True)
    refused = client.call("receive", name="bad", max=16, invisible=broker5.invisible_s)
    assert (refused["ok"], refused["code"]) == (False, 50001), refused
    # in the proxy's words only (the parser's complaint is in the broker's log)
    assert refused["message"].endswith(
        "org.apache.rocketmq.proxy.common.ProxyException: parse the consumer's subscription failed"
    ), refused
