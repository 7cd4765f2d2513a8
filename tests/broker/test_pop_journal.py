"""The POP state across a restart, on a real store (no network): what RocketMQ 5.3.3's
revive topic keeps (measured with the official Java client: /tmp sweep of 2026-11-29,
docs/broker.md). An unacked message stays invisible until its time ends and comes back as
the next attempt; a handle from before the restart still acks or changes its message; a
FIFO queue stays blocked by its message in flight."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from idemp.broker.config import BrokerConfig
from idemp.broker.metadata import TopicConfig
from idemp.broker.store import MessageStore
from idemp.broker.v5 import pop as popmod
from idemp.broker.v5 import popjournal
from idemp.broker.v5.pop import PopService
from idemp.remoting import MessageExt

Reopen = Callable[[MessageStore, bool], MessageStore]


class _Stores:
    """The stores a test opened; what is still open is closed at the end."""

    def __init__(self) -> None:
        self.open: list[MessageStore] = []

    def opened(self, config: BrokerConfig) -> MessageStore:
        store = MessageStore(config)
        self.open.append(store)
        return store

    def close(self, store: MessageStore) -> None:
        self.open.remove(store)
        store.close()


@pytest.fixture
def stores() -> Iterator[_Stores]:
    held = _Stores()
    yield held
    for store in held.open:
        store.close()


@pytest.fixture
def store(stores: _Stores, tmp_path: Path) -> MessageStore:
    """A broker's store with topic T (one queue), no broker around it."""
    first = stores.opened(BrokerConfig(storePathRootDir=str(tmp_path / "store")))
    first.topics.put(TopicConfig("T", 1, 1))
    return first


@pytest.fixture
def reopen(stores: _Stores) -> Reopen:
    """``reopen(store, crash)``: the store opened again as a restarted broker opens it.
    A graceful stop closes it first (its offset table saved); a crash does not, so the
    offset table is as last saved (here: never)."""

    def again(store: MessageStore, crash: bool) -> MessageStore:
        if not crash:
            stores.close(store)
        return stores.opened(store.config)

    return again


@pytest.fixture
def service(store: MessageStore, tmp_path: Path) -> PopService:
    """The POP service of ``store``, its journal beside it."""
    return PopService(store, "broker-a", journal=tmp_path / "journal")


def _put(store: MessageStore, body: bytes, topic: str = "T") -> None:
    store.put(MessageExt(topic=topic, body=body, properties={"UNIQ_KEY": body.hex()}))


def _pop(
    service: PopService, invisible_ms: int, batch: int = 16, fifo: bool = False
) -> list[popmod.Popped]:
    return service.pop(
        "G", "T", batch, invisible_ms, fifo=fifo, accepts=lambda m: True, max_attempts=17
    )


def _bodies(popped: list[popmod.Popped]) -> list[tuple[bytes, int]]:
    return sorted((p.message.body, p.attempt) for p in popped)


def _restarted(
    service: PopService, store: MessageStore, reopen: Reopen, crash: bool = False
) -> tuple[MessageStore, PopService]:
    """The broker's store and POP service after a restart: a graceful stop closes the
    service first, a crash leaves it as it was."""
    journal = service._journal
    assert journal is not None
    if not crash:
        service.close()
    store = reopen(store, crash)
    return store, PopService(store, "broker-a", journal=journal.path)


@pytest.mark.parametrize("crash", [False, True], ids=["graceful", "crash"])
def test_unacked_messages_wait_for_their_time_and_old_handles_still_ack(
    store: MessageStore, service: PopService, reopen: Reopen, crash: bool
) -> None:
    for body in (b"acked before", b"acked after", b"kept", b"changed"):
        _put(store, body)
    items = _pop(service, 1500)
    assert [p.message.body for p in items] == [b"acked before", b"acked after", b"kept", b"changed"]
    service.ack("G", "T", items[0].receipt.encode())
    store, service = _restarted(service, store, reopen, crash)
    _put(store, b"new")
    # the offset the group resumes from is the journal's, whatever the table saved
    assert store.offsets.query("G", "T", 0) == 1
    service.ack("G", "T", items[1].receipt.encode())  # a handle from before the restart
    service.change_invisible("G", "T", items[3].receipt.encode(), 1)
    assert store.offsets.query("G", "T", 0) == 2
    assert _bodies(_pop(service, 30_000)) == [(b"new", 1)]  # the rest is still invisible
    time.sleep(0.01)  # past the changed message's 1 ms
    assert service.revive() == 1
    assert _bodies(_pop(service, 30_000)) == [(b"changed", 2)]
    time.sleep(1.5)  # past the others' 1.5 s
    assert service.revive() == 1
    assert _bodies(_pop(service, 30_000)) == [(b"kept", 2)]


def test_a_message_whose_time_ran_out_while_the_broker_was_down_is_the_next_attempt(
    store: MessageStore, service: PopService, reopen: Reopen
) -> None:
    _put(store, b"late")
    assert len(_pop(service, 1)) == 1
    time.sleep(0.01)  # past its 1 ms, before the restart
    store, service = _restarted(service, store, reopen)
    assert service.pending()  # the revive loop has work at once
    assert service.revive() == 1
    assert _bodies(_pop(service, 30_000)) == [(b"late", 2)]


def test_a_fifo_queue_stays_blocked_by_its_message_in_flight(
    store: MessageStore, service: PopService, reopen: Reopen
) -> None:
    """As RocketMQ 5.3.3 after a graceful stop (its order info is saved at shutdown):
    nothing until the message's time ends, then the queue from it; one count for the
    batch, the fewest any of its messages was handed out (attempt 1, measured)."""
    for body in (b"a1", b"a2"):
        _put(store, body)
    (first,) = _pop(service, 1000, batch=1, fifo=True)
    assert first.message.body == b"a1"
    store, service = _restarted(service, store, reopen)
    assert _pop(service, 1000, fifo=True) == []
    time.sleep(1.05)
    service.revive()
    assert _bodies(_pop(service, 1000, fifo=True)) == [(b"a1", 1), (b"a2", 1)]


def test_a_deleted_group_leaves_nothing_in_flight(
    store: MessageStore, service: PopService, reopen: Reopen
) -> None:
    _put(store, b"m")
    _pop(service, 60_000)
    service.forget_group("G")
    store, service = _restarted(service, store, reopen)
    assert not service.pending()


def test_the_journal_is_rewritten_once_it_outgrows_the_state(
    store: MessageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(popjournal, "REWRITE_EVERY", 50)
    journal = tmp_path / "journal"
    service = PopService(store, "broker-a", journal=journal)
    for i in range(100):
        _put(store, b"m%d" % i)
        (item,) = _pop(service, 60_000, batch=1)
        service.ack("G", "T", item.receipt.encode())
    lines = journal.read_text().splitlines()
    # every pop and ack wrote lines (300 in all); a rewrite left one line for the queue
    # and what was written since (fewer than 50 + one message's 3)
    assert len(lines) < 53
    service.close()
    assert popjournal.replay(journal.read_text().splitlines()) == [["q", "G", "T", "T", 0, 100]]


def test_replay_takes_the_last_line_about_each_thing_and_skips_a_torn_one() -> None:
    lines = [
        '["q","G","T","T",0,1]',
        '["e","G","T","T",0,0,0,1,2,"0",9,0,3]',
        '["e","G","T","T",0,1,0,1,2,"0",9,0,3]',
        '["q","G","T","T",0,2]',
        '["x","G","T","T",0,0]',
        '["o","H","F",0,5,5,[],[],[]]',
        '["g","H"]',
        '["e","G","T","T",0,1,0,1,2,"0",9,0,7]',
        '["e","G","T","T",0,2,0,1',  # a crash in the middle of a write
    ]
    assert popjournal.replay(lines) == [
        ["q", "G", "T", "T", 0, 2],
        ["e", "G", "T", "T", 0, 1, 0, 1, 2, "0", 9, 0, 7],
    ]


def test_without_a_journal_nothing_is_written(store: MessageStore, tmp_path: Path) -> None:
    store.topics.put(TopicConfig("T2", 1, 1))
    service = PopService(store, "broker-a")
    _put(store, b"m", "T2")
    assert len(service.pop("G", "T2", 1, 60_000, fifo=False, accepts=lambda m: True,
                           max_attempts=17)) == 1  # fmt: skip
    assert not any(tmp_path.rglob("journal"))
    service.close()  # nothing to close
