"""FIFO: a message group's messages in order, one unacked message holding back its group.

RocketMQ 5 keeps order per queue (a group's messages all go to one queue, chosen by
hashing the group) and blocks the queue for a FIFO consumer group while a received
message is neither acked nor expired. Measured on RocketMQ 5.3.3 (../shared/realrmq5).
"""

from __future__ import annotations

from collections.abc import Callable

from idemp.broker.v5.service import consistent_hash
from idemp.remoting.javahash import java_string_hash as java_hash
from tests.broker.rawclient import RawClient

from .conftest import Client5, Endpoint5

QUEUES = 4
# long enough for the few requests a test makes while a group must stay blocked
FIFO_INVISIBLE_S = 6


def _groups_in_distinct_queues(n: int) -> list[str]:
    """Message group names that the proxy's hash puts in ``n`` different queues."""
    out: dict[int, str] = {}
    i = 0
    while len(out) < n:
        name = f"order-{i}"
        out.setdefault(consistent_hash(java_hash(name), QUEUES), name)
        i += 1
    return list(out.values())


def _groups_in_one_queue(n: int) -> list[str]:
    """``n`` message group names that the proxy's hash puts in the same queue."""
    by_queue: dict[int, list[str]] = {}
    i = 0
    while True:
        name = f"order-{i}"
        names = by_queue.setdefault(consistent_hash(java_hash(name), QUEUES), [])
        names.append(name)
        if len(names) == n:
            return names
        i += 1


def _fifo(admin: RawClient, client: Client5, names: Callable[[str], str]) -> tuple[str, str]:
    topic, group = names("F"), names("GF")
    assert admin.create_topic(topic, QUEUES, attributes="+message.type=FIFO").code == 0
    assert admin.create_group(group, consumeMessageOrderly=True).code == 0
    client.ok("producer", name="p", topics=[topic])
    client.ok("simple", name="c", group=group, subs={topic: "*"}, **{"await": 5})
    return topic, group


def test_group_order_and_an_unacked_message_blocks_only_its_group(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    inv = max(broker5.invisible_s, FIFO_INVISIBLE_S)
    client = client5()
    topic, _ = _fifo(admin, client, names)
    g1, g2 = _groups_in_distinct_queues(2)
    msgs = [
        {"topic": topic, "body": f"{g}:{i}", "message_group": g} for i in range(3) for g in (g1, g2)
    ]
    client.ok("send", name="p", messages=msgs)
    # RocketMQ indexes a message a moment after its send's answer: a receive in between
    # would lock the FIFO queue on part of the group
    assert admin.indexed(topic, range(QUEUES), 6) == 6
    first = client.receive_until(6, 30, inv, max=32)
    assert [m["body"] for m in first if m["message_group"] == g1] == [f"{g1}:{i}" for i in range(3)]
    assert [m["body"] for m in first if m["message_group"] == g2] == [f"{g2}:{i}" for i in range(3)]
    assert all(m["delivery_attempt"] == 1 for m in first)
    # g2 is acked, g1 is not: a new g2 message flows, g1's next one waits
    for m in first:
        if m["message_group"] == g2:
            client.ok("ack", name="c", ref=m["ref"])
    client.ok(
        "send",
        name="p",
        messages=[
            {"topic": topic, "body": f"{g1}:3", "message_group": g1},
            {"topic": topic, "body": f"{g2}:3", "message_group": g2},
        ],
    )
    second = client.receive_until(1, 30, inv, max=32)
    assert [m["body"] for m in second] == [f"{g2}:3"]
    client.ok("ack", name="c", ref=second[0]["ref"])
    # after its invisible time g1 comes back from its first unacked message, in order
    again = client.receive_until(4, inv + 15, inv, max=32)
    assert [m["body"] for m in again] == [f"{g1}:{i}" for i in range(4)]
    # one count per queue: the batch holds g1:3's first delivery, so all say attempt 1
    assert [m["delivery_attempt"] for m in again] == [1, 1, 1, 1]
    # never early: invisible from the server's pop, which came after the receive was asked
    blocked_since = min(m["asked"] for m in first if m["message_group"] == g1)
    assert min(m["at"] for m in again) - blocked_since >= inv
    for m in again:
        client.ok("ack", name="c", ref=m["ref"])


def test_an_expired_message_brings_back_what_its_queue_acked_after_it(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    """Two message groups in one queue: when the first group's message expires unacked,
    RocketMQ 5.3.3 reads the queue again from it (its committed offset) and hands out
    the other group's message too, though it was acked, both as handed out a second
    time (attempt 2; with a first delivery in the batch, all would say 1). A FIFO
    consumer sees such duplicates."""
    inv = max(broker5.invisible_s, FIFO_INVISIBLE_S)
    client = client5()
    topic, _ = _fifo(admin, client, names)
    g1, g2 = _groups_in_one_queue(2)
    bodies = [f"{g1}:0", f"{g2}:0"]
    sent = [{"topic": topic, "body": b, "message_group": b.split(":")[0]} for b in bodies]
    client.ok("send", name="p", messages=sent)
    assert admin.indexed(topic, range(QUEUES), 2) == 2
    first = client.receive_until(2, 30, inv, max=32)
    assert [m["body"] for m in first] == bodies
    client.ok("ack", name="c", ref=first[1]["ref"])  # g2's, not g1's
    again = client.receive_until(2, inv + 15, inv, max=32)
    assert [(m["body"], m["delivery_attempt"]) for m in again] == [(b, 2) for b in bodies]
    for m in again:
        client.ok("ack", name="c", ref=m["ref"])


def test_a_batch_handed_out_again_counts_the_attempt(
    broker5: Endpoint5,
    admin: RawClient,
    client5: Callable[[], Client5],
    names: Callable[[str], str],
) -> None:
    inv = max(broker5.invisible_s, FIFO_INVISIBLE_S)
    client = client5()
    topic, _ = _fifo(admin, client, names)
    (g1,) = _groups_in_distinct_queues(1)
    client.ok(
        "send",
        name="p",
        messages=[{"topic": topic, "body": f"{g1}:{i}", "message_group": g1} for i in range(2)],
    )
    assert admin.indexed(topic, range(QUEUES), 2) == 2
    first = client.receive_until(2, 30, inv, max=32)
    assert [(m["body"], m["delivery_attempt"]) for m in first] == [(f"{g1}:0", 1), (f"{g1}:1", 1)]
    again = client.receive_until(2, inv + 15, inv, max=32)
    assert [(m["body"], m["delivery_attempt"]) for m in again] == [(f"{g1}:0", 2), (f"{g1}:1", 2)]
    assert again[0]["at"] - first[0]["asked"] >= inv
    client.ok("ack", name="c", ref=again[0]["ref"])
    # the first acked, the second still invisible: nothing else of the group comes
    client.ok("send", name="p", messages=[{"topic": topic, "body": f"{g1}:2", "message_group": g1}])
    third = client.receive_until(2, inv + 15, inv, max=32)
    assert [(m["body"], m["delivery_attempt"]) for m in third] == [(f"{g1}:1", 1), (f"{g1}:2", 1)]
    assert third[0]["at"] - again[0]["asked"] >= inv


def test_a_message_of_the_wrong_type_is_refused(
    admin: RawClient, client5: Callable[[], Client5], names: Callable[[str], str]
) -> None:
    client = client5()
    topic, _ = _fifo(admin, client, names)
    # the client checks the route's accepted types itself before it sends anything
    answer = client.call("send", name="p", messages=[{"topic": topic, "body": "no group"}])
    assert (answer["ok"], answer["error"]) == (False, "IllegalArgumentException")
    assert "message_type:NORMAL, queue access type:FIFO" in answer["message"]
