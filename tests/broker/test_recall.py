"""Recall of a delayed message: the handle (pure) and the timer dropping what a marker
names. The RPC itself, with the official 5.x client, is in tests/v5/test_delivery.py."""

from __future__ import annotations

import base64
import time
import types

import pytest

from idemp.broker.store import TIMER_DELIVER_MS, MessageStore
from idemp.broker.timer import TimerService, delete_key
from idemp.broker.v5.recall import (
    RecallHandle,
    build_handle,
    parse_handle,
    refusal,
    timer_slot,
)
from idemp.remoting import MessageExt
from idemp.remoting.codes import Prop

# a handle RocketMQ 5.3.3 returned (2026-11-27, its proxy with rocketmq-python-client 5.1.2)
REAL = (
    "djEgVG9waWNSZWNhbGwgYnJva2VyLWEgMTc5NTc1MzA4MTAwMSAw"
    "MTAyRkMwMDAwMDAwMTcxQkMwQjFBOUU1QzAwMDAwMDAw"
)


def test_the_handle_is_rocketmqs() -> None:
    parsed = parse_handle(REAL)
    assert parsed == RecallHandle(
        "TopicRecall", "broker-a", "1795753081001", "0102FC0000000171BC0B1A9E5C00000000"
    )
    # sent for 1795753082000 (a whole second: the slot is the second before), + 1
    assert build_handle("TopicRecall", "broker-a", 1795753082000, parsed.message_id) == REAL
    assert timer_slot(1795753082000) == 1795753081000
    assert timer_slot(1795753082345) == 1795753082000


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not base64!",
        "A",  # no whole byte
        base64.urlsafe_b64encode(b"v2 T broker-a 1 ID").decode(),
        base64.urlsafe_b64encode(b"v1 T broker-a 1").decode(),
        base64.urlsafe_b64encode(b"v1 T broker-a 1   ").decode(),  # trailing empties dropped
    ],
)
def test_handles_rocketmq_cannot_decode(text: str) -> None:
    assert parse_handle(text) is None


def test_a_handle_without_padding_and_with_more_items() -> None:
    text = base64.urlsafe_b64encode(b"v1 T b 12 ID extra").decode().rstrip("=")
    assert parse_handle(text) == RecallHandle("T", "b", "12", "ID")


def test_refusals_in_rocketmqs_order_and_words() -> None:
    now = 1_000_000
    ok = RecallHandle("T", "b", str(now + 5000), "ID")
    assert refusal(ok, "T", "b", now) is None
    assert refusal(ok, "U", "other", now) == "recall failed, topic not match"
    assert refusal(ok, "T", "other", now) == "recall failed, broker service not available"
    for stamp in (str(now), str(now - 1), "abc", " 5", str(now + 3 * 86400 * 1000), "9" * 30):
        handle = RecallHandle("T", "b", stamp, "ID")
        assert refusal(handle, "T", "b", now) == "recall failed, timestamp invalid", stamp
    assert refusal(RecallHandle("T", "b", f"+{now + 5000}", "ID"), "T", "b", now) is None


def _delayed(store: MessageStore, uniq: str, at_ms: int) -> None:
    props = {"UNIQ_KEY": uniq, TIMER_DELIVER_MS: str(at_ms)}
    store.put(MessageExt(topic="T", body=uniq.encode(), properties=props), timer=True)


def _marker(store: MessageStore, uniq: str, at_ms: int) -> None:
    props = {
        "UNIQ_KEY": uniq,
        Prop.TIMER_DEL_UNIQKEY: delete_key("T", uniq),
        TIMER_DELIVER_MS: str(timer_slot(at_ms) + 1),
    }
    store.put(MessageExt(topic="T", body=b"0", properties=props), timer=True)


def _delivered(store: MessageStore) -> list[bytes]:
    cq = store.find_queue("T", 0)
    if cq is None:
        return []
    found = [store.lookup(cq.phy[i]) for i in range(cq.min_offset, cq.max_offset)]
    return [m.body for m in found if m is not None]


def _timer(store: MessageStore) -> TimerService:
    return TimerService(types.SimpleNamespace(store=store))


def test_a_marker_drops_its_message_and_no_other(store: MessageStore) -> None:
    at = (int(time.time()) + 60) * 1000  # ahead: the store parks them; a whole second,
    _delayed(store, "a", at)  # so the marker is due 999 ms before the messages
    _delayed(store, "b", at)
    _marker(store, "a", at)
    timer = _timer(store)
    assert timer.deliver_due(timer_slot(at) + 1)[0] == 0  # the marker alone
    assert timer.deliver_due(at)[0] == 1
    assert _delivered(store) == [b"b"]
    assert timer.recalled == {}  # matched and forgotten


def test_a_marker_due_with_its_message_in_one_pass(store: MessageStore) -> None:
    at = (int(time.time()) + 60) * 1000 + 1  # the marker's time is the message's own
    _delayed(store, "a", at)
    _marker(store, "a", at)
    assert _timer(store).deliver_due(at + 10)[0] == 0
    assert _delivered(store) == []


def test_after_a_restart_the_marker_is_read_again(store: MessageStore) -> None:
    at = (int(time.time()) + 60) * 1000 + 700
    _delayed(store, "a", at)
    _marker(store, "a", at)
    first = _timer(store)
    first.deliver_due(timer_slot(at) + 1)  # the marker came due, the message not yet
    assert first.recalled == {delete_key("T", "a"): timer_slot(at) + 1}
    again = _timer(store)  # a restart: what is above the delivered prefix is read again
    assert again.deliver_due(at)[0] == 0
    assert _delivered(store) == []


def test_a_marker_naming_nothing_is_forgotten_after_a_minute(store: MessageStore) -> None:
    at = (int(time.time()) + 60) * 1000 + 1
    _marker(store, "ghost", at)
    timer = _timer(store)
    timer.deliver_due(at)
    assert list(timer.recalled) == [delete_key("T", "ghost")]
    timer.deliver_due(at + 60_001)
    assert timer.recalled == {}
