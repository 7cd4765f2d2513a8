"""Delivery semantics of idemp's broker, seen through the OFFICIAL client (C++ inside
rocketmq-client-python 0.5.0rc2), every client in its own process (official_scripts.py).

Exactly-once delivery with content intact, tag filtering, orderly consumption, a group
split over two consumer processes, and broadcasting.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess
from tests.broker.official_scripts import (
    ClientProcess,
    Clients,
    Producer,
    clients_fixture,
    poll,
    wait_until,
)

pytestmark = pytest.mark.official

QUEUES = 4  # the C++ producer asks for 4 queues when it auto-creates a topic (TBW102 route)
CONSUME_TIMEOUT = 30.0  # bound for a few hundred messages on loopback; typically < 1 s


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[Clients]:
    yield from clients_fixture(tmp_path)


def _spec(topic: str, i: int, **extra: Any) -> dict[str, Any]:
    """A message whose content says which message it is; the body has non-ASCII text,
    and every 50th body is over 4 KiB so the C++ producer zlib-compresses it."""
    body = f"body-{i}-ünïcødé-€"
    if i % 50 == 7:
        body += "x" * 5000
    spec: dict[str, Any] = {
        "ref": i,
        "topic": topic,
        "body": body,
        "keys": f"key-{i} alt-{i}",
        "tags": None if i % 10 == 3 else f"Tag{i % 3}",
        "props": {"idx": str(i), "note": f"värde {i}; a=b"},
    }
    spec.update(extra)
    return spec


def _assert_contiguous_offsets(msgs: list[dict[str, Any]]) -> dict[int, int]:
    """Per queue, the consumed queue offsets are exactly 0..n-1; returns {queue: n}."""
    per_queue: dict[int, list[int]] = defaultdict(list)
    for m in msgs:
        per_queue[m["queue_id"]].append(m["queue_offset"])
    for qid, offsets in per_queue.items():
        assert sorted(offsets) == list(range(len(offsets))), f"queue {qid}: {sorted(offsets)}"
    return {qid: len(v) for qid, v in per_queue.items()}


def _create_topic(producer: Producer, topic: str) -> dict[str, Any]:
    """Send one message so the topic exists (auto-created with 4 queues) before consumers
    start: a C++ consumer of an unknown topic only retries its route every 30 s."""
    [sent] = producer.send([{"ref": "create", "topic": topic, "body": "create", "tags": "Init"}])
    return sent


def test_every_message_once_with_content_and_offsets(
    broker: BrokerProcess, clients: Clients
) -> None:
    topic, total = "OffDelivery", 300
    producer = clients.producer(broker.namesrv_addr)
    specs = [_spec(topic, i) for i in range(total)]
    # Half before the consumer exists (a new group on a young queue starts at offset 0),
    # half while it runs.
    sent = producer.send(specs[: total // 2])
    consumer = clients.consumer(broker.namesrv_addr, "off-delivery", topic, props=["idx", "note"])
    sent += producer.send(specs[total // 2 :])
    consumer.wait(lambda: len(consumer.messages) >= total, CONSUME_TIMEOUT, f"{total} messages")
    clients.stop_all([consumer, producer])

    msgs = consumer.messages
    assert consumer.errors() == []
    assert len(msgs) == total  # none duplicated (stop drained every callback)
    sent_ids = {s["ref"]: s["msg_id"] for s in sent}
    assert len(set(sent_ids.values())) == total
    got = {m["id"]: m for m in msgs}
    assert set(got) == set(sent_ids.values())
    for s, spec in zip(sent, specs):
        m = got[s["msg_id"]]
        assert m["topic"] == topic
        assert m["body"] == spec["body"]
        assert m["keys"] == spec["keys"]
        assert m["tags"] == (spec["tags"] or "")  # the C++ client reads a missing tag as ""
        assert m["props"] == spec["props"]
        assert m["reconsume_times"] == 0
        assert m["queue_offset"] == s["offset"]  # what the send result said
    counts = _assert_contiguous_offsets(msgs)
    assert set(counts) == set(range(QUEUES))  # round-robin sends reach every queue
    assert sum(counts.values()) == total


def test_tag_filter_delivers_exactly_the_subscribed_tags(
    broker: BrokerProcess, clients: Clients
) -> None:
    topic = "OffTags"
    producer = clients.producer(broker.namesrv_addr)
    _create_topic(producer, topic)
    consumer = clients.consumer(
        broker.namesrv_addr, "off-tags", topic, expression="TagA || TagB", props=["idx"]
    )
    tags = ["TagA", "TagB", "TagC", None, "TagAB", "taga"]
    specs: list[dict[str, Any]] = [
        {"ref": i, "topic": topic, "body": f"m{i}", "tags": tags[i % 6], "props": {"idx": str(i)}}
        for i in range(120)
    ]
    # Every queue ends with subscribed messages (the last 20 are TagA/TagB), so once all
    # of those arrived, each queue was pulled past every message that must not arrive.
    specs += [
        {"ref": i, "topic": topic, "body": f"m{i}", "tags": ["TagA", "TagB"][i % 2]}
        for i in range(120, 140)
    ]
    producer.send(specs)
    wanted = {s["body"] for s in specs if s["tags"] in ("TagA", "TagB")}
    consumer.wait(
        lambda: wanted <= {m["body"] for m in consumer.messages},
        CONSUME_TIMEOUT,
        f"{len(wanted)} TagA/TagB messages",
    )
    clients.stop_all([consumer, producer])

    msgs = consumer.messages
    assert consumer.errors() == []
    assert sorted(m["body"] for m in msgs) == sorted(wanted)  # once each, nothing else
    assert {m["body"]: m["tags"] for m in msgs} == {
        s["body"]: s["tags"] for s in specs if s["body"] in wanted
    }
    # The "create" message (tag Init) is not subscribed either.
    assert "create" not in {m["body"] for m in msgs}


def test_orderly_consumer_sees_each_key_in_send_order(
    broker: BrokerProcess, clients: Clients
) -> None:
    topic, keys, per_key = "OffOrderly", [f"order-{k}" for k in range(6)], 25
    producer = clients.producer(broker.namesrv_addr)
    specs = [
        {"ref": n, "topic": topic, "body": f"{key}:{seq}", "sharding_key": key, "keys": key}
        for n, (seq, key) in enumerate((s, k) for s in range(per_key) for k in keys)
    ]
    half = len(specs) // 2
    producer.send(specs[:half])  # also creates the topic before the consumer starts
    consumer = clients.consumer(broker.namesrv_addr, "off-orderly", topic, orderly=True)
    producer.send(specs[half:])
    # An orderly C++ consumer starts consuming ~10 s after start() (it waits for its
    # queue locks; ENVIRONMENT.md); 45 s bounds that plus 150 one-at-a-time callbacks.
    consumer.wait(lambda: len(consumer.messages) >= len(specs), 45.0, f"{len(specs)} messages")
    clients.stop_all([consumer, producer])

    msgs = consumer.messages
    assert consumer.errors() == []
    assert len(msgs) == len(specs)
    seen: dict[str, list[int]] = defaultdict(list)
    queue_of: dict[str, set[int]] = defaultdict(set)
    for m in msgs:  # events are in callback order (emitted under one lock)
        key, seq = m["body"].split(":")
        assert m["keys"] == key
        seen[key].append(int(seq))
        queue_of[key].add(m["queue_id"])
    assert dict(seen) == {key: list(range(per_key)) for key in keys}
    assert all(len(q) == 1 for q in queue_of.values()), dict(queue_of)
    # Within a queue, consumption follows the queue offsets.
    per_queue: dict[int, list[int]] = defaultdict(list)
    for m in msgs:
        per_queue[m["queue_id"]].append(m["queue_offset"])
    assert all(v == sorted(v) for v in per_queue.values())
    _assert_contiguous_offsets(msgs)


def _bodies(consumers: list[ClientProcess]) -> set[str]:
    return {m["body"] for c in consumers for m in c.messages}


def _have_all(consumers: list[ClientProcess], wanted: set[str]) -> bool:
    """Together, ``consumers`` received every body in ``wanted``."""
    return wanted <= _bodies(consumers)


def _settle(producer: Producer, topic: str, consumers: list[ClientProcess]) -> None:
    """Wait until a group of clustering consumers has rebalanced: a probe round (one
    message per queue, round-robin) is consumed exactly once, by owners whose queue sets
    are disjoint and non-empty. A consumer still pulling a queue it no longer owns would
    show as a duplicate. NOTIFY_CONSUMER_IDS_CHANGED makes both rebalance at once, so
    the first round normally settles it; rounds are bounded."""
    for rnd in range(5):
        probes = {f"probe-{rnd}-{i}" for i in range(QUEUES)}
        producer.send({"ref": b, "topic": topic, "body": b} for b in sorted(probes))
        # A queue nobody owns yet waits for the next periodic rebalance (10 s).
        wait_until(partial(_have_all, consumers, probes), 15.0, f"probe round {rnd}", *consumers)
        got = [m for c in consumers for m in c.messages if m["body"] in probes]
        owners = [{m["queue_id"] for m in c.messages if m["body"] in probes} for c in consumers]
        if len(got) == QUEUES and all(owners) and not set.intersection(*owners):
            return
    raise AssertionError("the consumer group never settled")


def test_two_consumer_processes_split_the_queues(broker: BrokerProcess, clients: Clients) -> None:
    topic, total = "OffSplit", 200
    producer = clients.producer(broker.namesrv_addr)
    _create_topic(producer, topic)
    first = clients.consumer(broker.namesrv_addr, "off-split", topic, name="first")
    second = clients.consumer(broker.namesrv_addr, "off-split", topic, name="second")
    _settle(producer, topic, [first, second])
    specs = [{"ref": i, "topic": topic, "body": f"split-{i}"} for i in range(total)]
    producer.send(specs)
    wanted = {s["body"] for s in specs}

    def received() -> list[str]:
        return [m["body"] for c in (first, second) for m in c.messages if m["body"] in wanted]

    wait_until(
        lambda: set(received()) == wanted, CONSUME_TIMEOUT, f"{total} messages", first, second
    )
    clients.stop_all([first, second, producer])

    assert first.errors() == [] and second.errors() == []
    bodies = received()
    assert len(bodies) == total and set(bodies) == wanted  # every one, exactly once
    queues = [{m["queue_id"] for m in c.messages if m["body"] in wanted} for c in (first, second)]
    assert queues[0] and queues[1]
    assert queues[0].isdisjoint(queues[1])
    assert queues[0] | queues[1] == set(range(QUEUES))
    # AllocateMessageQueueAveragely: 4 queues over 2 clients is 2 + 2.
    assert sorted(len(q) for q in queues) == [2, 2]


def test_broadcasting_consumers_each_receive_every_message(
    broker: BrokerProcess, clients: Clients
) -> None:
    topic, total = "OffBroadcast", 100
    producer = clients.producer(broker.namesrv_addr)
    _create_topic(producer, topic)
    consumers = [
        clients.consumer(broker.namesrv_addr, "off-broadcast", topic, broadcasting=True, name=n)
        for n in ("one", "two")
    ]
    # A broadcasting C++ consumer keeps offsets locally and, having none, starts each
    # queue at its max offset (CONSUME_FROM_LAST_OFFSET). Wait until every consumer has
    # received a probe from every queue: a probe is received only if the queue's start
    # offset was taken before it was stored, so everything sent after is received.
    probes: set[str] = set()

    def ready() -> bool:
        return all(
            {m["queue_id"] for m in c.messages if m["body"] in probes} == set(range(QUEUES))
            for c in consumers
        )

    for rnd in range(10):
        bodies = [f"probe-{rnd}-{i}" for i in range(QUEUES)]
        probes.update(bodies)
        producer.send({"ref": b, "topic": topic, "body": b} for b in bodies)
        # A probe stored before its queue's start offset is never delivered, so this wait
        # is short and only bounds the round; readiness is the positive evidence above.
        if poll(ready, 2.0, *consumers):
            break
    else:
        raise AssertionError("broadcasting consumers never started on every queue")
    specs = [{"ref": i, "topic": topic, "body": f"bc-{i}"} for i in range(total)]
    producer.send(specs)
    wanted = {s["body"] for s in specs}
    wait_until(
        lambda: all(wanted <= _bodies([c]) for c in consumers),
        CONSUME_TIMEOUT,
        f"{total} messages at each consumer",
        *consumers,
    )
    clients.stop_all([*consumers, producer])

    for c in consumers:
        assert c.errors() == []
        counts = Counter(m["body"] for m in c.messages if m["body"] in wanted)
        assert set(counts) == wanted
        assert set(counts.values()) == {1}
