"""An idemp runner and the official client (C++ inside) in ONE consumer group, as while a
service moves from one to the other: both split the queues as RocketMQ does
(AllocateMessageQueueAveragely over the sorted client ids), so each queue is read by one
of them and every message is consumed once; orderly, the broker's queue locks settle
which one reads a queue, and each keeps its queues' order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import Message
from idemp.runners import ConcurrentRunner, OrderlyRunner
from tests.broker.official_scripts import Clients, poll, wait_until

pytest.importorskip("rocketmq.client")

QUEUES, PER_QUEUE = 4, 10


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
def test_an_idemp_runner_and_an_official_consumer_share_one_group(
    orderly: bool, make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = make_broker()
    topic, group = "MixedT", "mixed-g"
    producer = Producer(broker.namesrv_addr, "mixed-p").start()
    queues = sorted(producer.publish_queues(topic), key=lambda q: q.queue_id)
    assert len(queues) == QUEUES
    lock = threading.Lock()
    ours: list[tuple[int, int, str]] = []  # (queue, offset, body) seen by idemp's runner

    def listener(message: Message) -> None:
        with lock:
            ours.append((message.queue_id, message.queue_offset, message.body.decode()))

    runner_cls = OrderlyRunner if orderly else ConcurrentRunner
    runner = runner_cls(
        listener,
        settings=ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0),
    )
    runner.subscribe(topic)
    clients = Clients(tmp_path / "client-home")
    try:
        # idemp's runner first: the official client then sees both ids at its first
        # rebalance (it gives queues up at its periodic rebalance, not at the broker's
        # notice that the group changed; seen as ~30 s here and on RocketMQ 4.9.7)
        runner.start()
        official = clients.consumer(broker.namesrv_addr, group, topic, orderly=orderly)

        def theirs() -> list[tuple[int, int, str]]:
            return [(m["queue_id"], m["queue_offset"], m["body"]) for m in official.messages]

        # Settled once a probe on each queue is consumed by exactly one of the two, two
        # queues each (each client rebalances when the broker tells it the group changed).
        probes: list[str] = []

        def settled() -> bool:
            last = set(probes[-QUEUES:])
            with lock:
                here = [q for q, _, b in ours if b in last]
            there = [q for q, _, b in theirs() if b in last]
            both = len(here) + len(there) == QUEUES and len(set(here) | set(there)) == QUEUES
            return both and len(set(here)) == 2

        for rnd in range(45):  # the official client rebalances every 20 s or so
            probes += [f"probe-{rnd}-{q.queue_id}" for q in queues]
            for q, body in zip(queues, probes[-QUEUES:]):
                producer.send(OutMessage(topic, body.encode()), queue=q)
            if poll(settled, 2.0, official):
                break
        else:
            raise AssertionError(f"the group never settled: idemp {ours}, official {theirs()}")
        with lock:
            settled_at = (len(ours), len(official.messages))
        bodies = [f"m-{q.queue_id}-{i}" for i in range(PER_QUEUE) for q in queues]
        for i in range(PER_QUEUE):
            for q in queues:
                producer.send(OutMessage(topic, f"m-{q.queue_id}-{i}".encode()), queue=q)
        wanted = set(bodies)

        def all_in() -> bool:
            with lock:
                got = [b for _, _, b in ours + theirs() if b in wanted]
            return set(got) == wanted

        wait_until(all_in, 30.0, "every message by one of the two", official)
        clients.stop_all([official])
    finally:
        runner.shutdown()
        producer.shutdown()
        clients.close()

    with lock:
        mine = [r for r in ours[settled_at[0] :] if r[2] in wanted]
    other = [r for r in theirs()[settled_at[1] :] if r[2] in wanted]
    assert sorted(b for _, _, b in mine + other) == sorted(bodies)  # each once
    mine_q, other_q = {q for q, _, _ in mine}, {q for q, _, _ in other}
    assert (len(mine_q), len(other_q), mine_q & other_q) == (2, 2, set())
    if orderly:  # each side read its queues in their order
        for side in (mine, other):
            for qid in {q for q, _, _ in side}:
                got = [b for qq, _, b in side if qq == qid]
                assert got == [f"m-{qid}-{i}" for i in range(PER_QUEUE)]
