"""What survives a broker restart, seen through the OFFICIAL client: consumer offsets
across SIGTERM, acked messages across SIGKILL with SYNC_FLUSH, and whole messages across
a torn commit-log tail. Every client runs in its own process (official_scripts.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.commitlog import FILE_NAME
from idemp.broker.process import BrokerProcess
from idemp.remoting import jsonlenient
from tests.broker.official_scripts import Clients, clients_fixture

pytestmark = pytest.mark.official

CONSUME_TIMEOUT = 30.0  # bound for ~100 messages on loopback; typically < 1 s
PHYSICAL_OFFSET_AT = 28  # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG (4 each), QUEUEOFFSET (8)
BODY_AT = 88  # the 84-byte fixed part (IPv4 hosts), then BODYLENGTH (4)


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[Clients]:
    yield from clients_fixture(tmp_path)


def _specs(topic: str, prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {"ref": f"{prefix}{i}", "topic": topic, "body": f"{prefix}{i}", "keys": f"{prefix}{i}"}
        for i in range(n)
    ]


def _consume_all(
    clients: Clients, broker: BrokerProcess, group: str, topic: str, wanted: set[str]
) -> list[dict[str, Any]]:
    """Start a consumer, wait for ``wanted``, stop it (draining callbacks); its messages."""
    consumer = clients.consumer(broker.namesrv_addr, group, topic, name=f"{group}-consumer")
    consumer.wait(
        lambda: wanted <= {m["body"] for m in consumer.messages},
        CONSUME_TIMEOUT,
        f"{len(wanted)} messages",
    )
    consumer.stop()
    assert consumer.errors() == []
    return consumer.messages


def _assert_once(msgs: list[dict[str, Any]], wanted: set[str]) -> None:
    bodies = Counter(m["body"] for m in msgs)
    assert set(bodies) == wanted
    assert set(bodies.values()) == {1}


def _assert_offset_file(
    broker: BrokerProcess, group: str, expected: dict[str, Counter[int]]
) -> None:
    """``consumerOffset.json`` is RocketMQ's shape, "topic@group" -> {queueId: next offset
    to consume}, with exactly ``expected``, plus the group's %RETRY% queue at 0 once the
    client has committed it: the retry topic is created by the group's first heartbeat,
    so a client pulls (and commits) it only after its next route refresh (3 s after its
    start) and rebalance (every 10 s), or from start when the topic existed already."""
    # read as fastjson writes it too: RocketMQ's queue ids are bare integer keys
    data = jsonlenient.loads((broker.store / "config" / "consumerOffset.json").read_text())
    table = dict(data["offsetTable"])
    retry = table.pop(f"%RETRY%{group}@{group}", None)
    assert retry in (None, {"0": 0})
    assert table == {k: {str(q): n for q, n in v.items()} for k, v in expected.items()}
    assert set(data) == {"offsetTable"}


@pytest.mark.parametrize("first_stops", ["before_restart", "after_restart"])
def test_consumer_offsets_survive_broker_restart(
    make_broker: Callable[..., BrokerProcess], clients: Clients, first_stops: str
) -> None:
    broker = make_broker()
    topic, group = "OffRestart", "off-restart"
    key = f"{topic}@{group}"
    producer = clients.producer(broker.namesrv_addr)
    old = _specs(topic, "old-", 40)
    producer.send(old)
    producer.stop()
    first = clients.consumer(broker.namesrv_addr, group, topic)
    first.wait(lambda: len(first.messages) >= len(old), CONSUME_TIMEOUT, "the old messages")
    if first_stops == "before_restart":
        first.stop()  # shutdown() commits the consumer's offsets
    assert broker.stop() == 0  # SIGTERM: offsets and log flushed, exit 0
    per_queue = Counter(m["queue_id"] for m in first.messages)
    if first_stops == "before_restart":
        _assert_offset_file(broker, group, {key: per_queue})
    broker.start()
    if first_stops == "after_restart":
        # Its periodic commit (every 5 s) may not have reached the old broker; its
        # shutdown commits to the restarted one, over a new connection.
        first.stop()
    assert first.errors() == []
    _assert_once(first.messages, {s["body"] for s in old})

    producer = clients.producer(broker.namesrv_addr)
    new = _specs(topic, "new-", 20)
    producer.send(new)
    producer.stop()
    # A new process of the same group starts where the first one stopped: every queue
    # got new messages after its old ones, so a lost offset would replay old messages
    # before the new ones of that queue, and they would be in this list.
    again = _consume_all(clients, broker, group, topic, {s["body"] for s in new})
    _assert_once(again, {s["body"] for s in new})
    assert {m["queue_id"] for m in again} == set(per_queue)
    assert broker.stop() == 0
    _assert_offset_file(broker, group, {key: per_queue + Counter(m["queue_id"] for m in again)})


@pytest.mark.idemp_only("reads idemp's ready line")
def test_sync_flush_acked_messages_survive_sigkill(
    make_broker: Callable[..., BrokerProcess], clients: Clients
) -> None:
    broker = make_broker(flushDiskType="SYNC_FLUSH")
    topic, k = "OffSyncFlush", 100
    producer = clients.producer(broker.namesrv_addr)
    sent = producer.send(_specs(topic, "acked-", k))  # each SEND_OK, i.e. fsynced
    broker.kill()  # SIGKILL right after the last ack: no flush, no goodbye
    producer.stop()
    # (A SIGKILL keeps the page cache, so this shows "acked means written", not the
    # fsync itself; SYNC_FLUSH is what makes the ack wait for the fsync.)
    broker.start()
    assert f"recovered={k}" in broker.ready_line.split()
    msgs = _consume_all(clients, broker, "off-syncflush", topic, {f"acked-{i}" for i in range(k)})
    _assert_once(msgs, {f"acked-{i}" for i in range(k)})
    assert {m["id"] for m in msgs} == {s["msg_id"] for s in sent}


def _torn_partial(log: bytes, last: bytes) -> bytes:
    return last[: len(last) // 2]  # a record whose write stopped half way


def _torn_size_field(log: bytes, last: bytes) -> bytes:
    return last[:3]  # not even the 4-byte TOTALSIZE made it


def _torn_zeros(log: bytes, last: bytes) -> bytes:
    return bytes(4096)  # the file grew but its data never reached the disk


def _torn_garbage(log: bytes, last: bytes) -> bytes:
    return (64).to_bytes(4, "big") + b"\xab" * 60  # whole by its size, but no magic code


def _torn_bad_crc(log: bytes, last: bytes) -> bytes:
    """A whole record at the right offset whose body did not reach the disk."""
    rec = bytearray(last)
    rec[PHYSICAL_OFFSET_AT : PHYSICAL_OFFSET_AT + 8] = len(log).to_bytes(8, "big")
    rec[BODY_AT] ^= 0xFF
    return bytes(rec)


@pytest.mark.idemp_only("idemp's commit log file and log line")
@pytest.mark.parametrize(
    "make_tail", [_torn_partial, _torn_size_field, _torn_zeros, _torn_garbage, _torn_bad_crc]
)
def test_torn_commit_log_tail_is_cut_at_start(
    make_broker: Callable[..., BrokerProcess],
    clients: Clients,
    make_tail: Callable[[bytes, bytes], bytes],
) -> None:
    broker = make_broker()
    topic, k = "OffTorn", 30
    producer = clients.producer(broker.namesrv_addr)
    producer.send(_specs(topic, "whole-", k))
    producer.stop()
    assert broker.stop() == 0

    path = broker.store / "commitlog" / FILE_NAME
    log = path.read_bytes()
    # The last record: records are back to back, each starting with its TOTALSIZE.
    pos = 0
    while pos + int.from_bytes(log[pos : pos + 4], "big") < len(log):
        pos += int.from_bytes(log[pos : pos + 4], "big")
    tail = make_tail(log, log[pos:])
    path.write_bytes(log + tail)

    broker.start()
    assert f"recovered={k}" in broker.ready_line.split()
    assert path.stat().st_size == len(log)
    assert (
        f"commit log: cut {len(tail)} bytes of torn or corrupt tail at offset {len(log)}"
        in broker.log_path.read_text()
    )
    producer = clients.producer(broker.namesrv_addr)
    after = producer.send(_specs(topic, "after-", 10))
    producer.stop()
    wanted = {f"whole-{i}" for i in range(k)} | {f"after-{i}" for i in range(10)}
    msgs = _consume_all(clients, broker, "off-torn", topic, wanted)
    _assert_once(msgs, wanted)
    # The new messages continue each queue's offsets where the whole ones ended.
    per_queue: dict[int, list[int]] = {}
    for m in msgs:
        per_queue.setdefault(m["queue_id"], []).append(m["queue_offset"])
    assert all(sorted(v) == list(range(len(v))) for v in per_queue.values())
    assert {m["queue_offset"] for m in msgs if m["body"].startswith("after-")} == {
        s["offset"] for s in after
    }
