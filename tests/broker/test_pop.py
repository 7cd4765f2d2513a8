"""POP state on a real store (no network): the rules tests/v5 cannot reach in seconds —
auto-renewal of a PushConsumer's messages, a departed client's messages, revive into the
retry topic. The timing constants are narrowed per test instead of waiting a minute."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from idemp.broker.config import BrokerConfig
from idemp.broker.metadata import TopicConfig
from idemp.broker.store import MessageStore
from idemp.broker.v5 import pop as popmod
from idemp.broker.v5.pop import HandleError, MalformedHandle, PopService, Receipt, pop_retry_topic
from idemp.remoting import MessageExt


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = MessageStore(BrokerConfig(storePathRootDir=str(tmp_path / "store")))
    s.topics.put(TopicConfig("T", 1, 1))
    yield s
    s.close()


def _put(store: MessageStore, body: bytes) -> None:
    store.put(MessageExt(topic="T", body=body, properties={"UNIQ_KEY": body.hex()}))


def _pop(
    service: PopService, invisible_ms: int, renew_for: str | None = None
) -> list[popmod.Popped]:
    return service.pop(
        "G", "T", 16, invisible_ms, fifo=False, accepts=lambda m: True, max_attempts=17,
        renew_for=renew_for,
    )  # fmt: skip


def test_auto_renewed_message_stays_invisible_while_its_client_lives(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = PopService(store, "broker-a")
    _put(store, b"slow")
    (item,) = _pop(service, 1000, renew_for="client-1")
    monkeypatch.setattr(popmod, "RENEW_AHEAD_MS", 10**9)  # every message is due
    assert service.renew(lambda client: client == "client-1") == 1
    time.sleep(1.1)  # past the handle's own invisible time (1 s)
    assert service.revive() == 0  # renewed: not handed out again
    service.ack("G", "T", item.receipt.encode())  # the original handle still acks
    assert _pop(service, 1000) == []


def test_a_message_is_not_renewed_once_its_client_is_gone(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = PopService(store, "broker-a")
    _put(store, b"orphan")
    (item,) = _pop(service, 1000, renew_for="client-1")
    monkeypatch.setattr(popmod, "RENEW_AHEAD_MS", 10**9)
    assert service.renew(lambda client: False) == 0
    time.sleep(1.1)
    with pytest.raises(HandleError, match="expired"):
        service.ack("G", "T", item.receipt.encode())
    assert service.revive() == 1
    (again,) = _pop(service, 30_000)
    assert (again.message.body, again.attempt, again.message.topic) == (b"orphan", 2, "T")
    assert again.receipt.topic_type == popmod.RETRY_TOPIC
    assert store.max_offset(pop_retry_topic("G", "T"), 0) == 1


def test_a_departed_clients_messages_come_back_after_a_second(store: MessageStore) -> None:
    service = PopService(store, "broker-a")
    _put(store, b"left")
    (item,) = _pop(service, 60_000, renew_for="client-1")
    service.release_client("client-1")
    time.sleep(popmod.CLEAR_MS / 1000 + 0.1)
    assert service.revive() == 1
    (again,) = _pop(service, 30_000)
    assert (again.message.body, again.attempt) == (b"left", 2)


def test_change_of_invisible_duration_ends_renewal_and_voids_the_old_handle(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = PopService(store, "broker-a")
    _put(store, b"nack")
    (item,) = _pop(service, 60_000, renew_for="client-1")
    fresh = service.change_invisible("G", "T", item.receipt.encode(), 1000)
    with pytest.raises(HandleError, match="INVALID_RECEIPT_HANDLE"):
        service.ack("G", "T", item.receipt.encode())
    monkeypatch.setattr(popmod, "RENEW_AHEAD_MS", 10**9)
    assert service.renew(lambda client: True) == 0
    time.sleep(1.1)
    assert service.revive() == 1
    (again,) = _pop(service, 30_000)
    assert again.attempt == 2
    with pytest.raises(HandleError, match="expired"):
        service.ack("G", "T", fresh.encode())


def test_malformed_and_forged_handles(store: MessageStore) -> None:
    service = PopService(store, "broker-a")
    with pytest.raises(MalformedHandle, match="Parse failed, dataList size 3"):
        service.ack("G", "T", "not a handle")
    with pytest.raises(MalformedHandle, match="not a number"):
        service.ack("G", "T", "1 2 3 0 0 broker-a x 7 9")
    forged = Receipt(0, int(time.time() * 1000), 60_000, "0", "broker-a", 0, 99, 0)
    service.ack("G", "T", forged.encode())  # nothing invisible under it: accepted


def test_a_popped_message_never_handed_over_is_visible_again_at_once(
    store: MessageStore,
) -> None:
    service = PopService(store, "broker-a")
    _put(store, b"lost in transit")
    (item,) = _pop(service, 60_000, renew_for="client-1")
    service.release("G", "T", [item.receipt])  # the receive call broke before sending it
    assert service.revive() == 1
    (again,) = _pop(service, 60_000)
    assert (again.message.body, again.attempt) == (b"lost in transit", 1)
