"""POP state on a real store (no network): the rules tests/v5 cannot reach in seconds —
auto-renewal of a PushConsumer's messages, a departed client's messages, revive into the
retry topic. The timing constants are narrowed per test instead of waiting a minute."""

from __future__ import annotations

import asyncio
import time
import types

import pytest

from idemp.broker.metadata import TopicConfig
from idemp.broker.store import MessageStore
from idemp.broker.v5 import pop as popmod
from idemp.broker.v5.pop import (
    HandleError,
    MalformedHandle,
    OffsetOutside,
    PopService,
    Receipt,
    pop_retry_topic,
)
from idemp.remoting import MessageExt


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


def test_change_of_invisible_duration_ends_renewal_and_an_ack_of_the_old_handle_acks_nothing(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RocketMQ 5.3.3 takes the replaced handle until its own time runs out; its ack
    answers OK and leaves the newer delivery standing (measured): the message comes back."""
    service = PopService(store, "broker-a")
    _put(store, b"nack")
    (item,) = _pop(service, 60_000, renew_for="client-1")
    fresh = service.change_invisible("G", "T", item.receipt.encode(), 1000)
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
    with pytest.raises(MalformedHandle, match='For input string: "x". NumberFormatException'):
        service.ack("G", "T", "1 2 3 0 0 broker-a x 7 9")
    now = int(time.time() * 1000)
    forged = Receipt(0, now, 60_000, "0", "broker-a", 0, 0, 0)
    service.ack("G", "T", forged.encode())  # nothing invisible under it: accepted
    beyond = Receipt(0, now, 60_000, "0", "broker-a", 0, 99, 0)
    with pytest.raises(OffsetOutside):  # the queue holds no offset 99: NO_MESSAGE
        service.ack("G", "T", beyond.encode())


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


def test_committed_offset_is_the_first_message_still_in_flight(store: MessageStore) -> None:
    """What a restarted broker resumes from: acks out of order and an expired message
    move it only as far as the first message still invisible."""
    service = PopService(store, "broker-a")
    for i in range(6):
        _put(store, b"m%d" % i)

    def pop(batch: int, invisible_ms: int = 60_000) -> list[popmod.Popped]:
        return service.pop(
            "G", "T", batch, invisible_ms, fifo=False, accepts=lambda m: True, max_attempts=17
        )

    def committed() -> int | None:
        return store.offsets.query("G", "T", 0)

    first = pop(3)
    assert [p.message.queue_offset for p in first] == [0, 1, 2]
    assert committed() == 0
    service.ack("G", "T", first[1].receipt.encode())
    assert committed() == 0  # offset 0 is still invisible
    service.ack("G", "T", first[0].receipt.encode())
    assert committed() == 2
    (short,) = pop(1, invisible_ms=1)
    assert short.message.queue_offset == 3
    service.ack("G", "T", first[2].receipt.encode())
    assert committed() == 3  # offset 3 is still invisible
    time.sleep(0.005)  # past offset 3's invisible time of 1 ms
    assert service.revive() == 1  # into the retry topic: no longer holds the queue back
    assert committed() == 4


def test_a_receive_reads_past_what_it_does_not_accept(store: MessageStore) -> None:
    """A batch is filled across reads: messages the filter rejects do not count."""
    service = PopService(store, "broker-a")
    for i in range(7):
        _put(store, b"m%d" % i)
    odd = service.pop(
        "G", "T", 3, 60_000, fifo=False, accepts=lambda m: m.body[-1] % 2 == 1, max_attempts=17
    )
    assert [p.message.body for p in odd] == [b"m1", b"m3", b"m5"]
    rest = service.pop("G", "T", 3, 60_000, fifo=False, accepts=lambda m: True, max_attempts=17)
    assert [p.message.body for p in rest] == [b"m6"]  # the rejected ones are not redelivered


def test_fifo_queue_reads_again_from_its_first_unacked_message(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As RocketMQ 5.3.3's order POP: once an unacked message's time is over, the queue
    is read again from it (its committed offset), what was acked after it included;
    what the filter refused stays out."""
    clock = [1_000_000.0]  # the POP state's wall clock, in seconds, moved by hand
    monkeypatch.setattr(popmod, "time", types.SimpleNamespace(time=lambda: clock[0]))
    service = PopService(store, "broker-a")
    for i in range(6):
        _put(store, b"m%d" % i)

    def pop(batch: int) -> list[popmod.Popped]:
        return service.pop(
            "G", "T", batch, 10_000, fifo=True, accepts=lambda m: m.body != b"m2",
            max_attempts=17,
        )  # fmt: skip

    first = pop(4)
    assert [(p.message.body, p.attempt) for p in first] == [
        (b"m0", 1), (b"m1", 1), (b"m3", 1), (b"m4", 1),
    ]  # fmt: skip
    clock[0] += 9.999
    assert pop(4) == []  # the queue waits for its messages
    service.ack("G", "T", first[1].receipt.encode())
    clock[0] += 0.001  # their invisible time is over
    again = pop(4)
    # m1 acked, and delivered again; m2 filtered out. The attempt is one count for the
    # queue, the fewest deliveries in the batch (RocketMQ's): each had one, m1 too
    assert [(p.message.body, p.attempt) for p in again] == [
        (b"m0", 2), (b"m1", 2), (b"m3", 2), (b"m4", 2),
    ]  # fmt: skip
    assert pop(4) == []
    for p in again:
        service.ack("G", "T", p.receipt.encode())
    assert [p.message.body for p in pop(4)] == [b"m5"]


def test_a_cancelled_wait_ends_even_when_a_message_arrives_in_the_same_turn(
    store: MessageStore,
) -> None:
    """Found by the http2 fuzzer: a receive whose connection was lost kept polling, because
    Python 3.11's ``asyncio.wait_for`` drops a cancellation that comes with its future's
    result, and the poll loop then waited again, up to its deadline."""
    service = PopService(store, "broker-a")

    async def scenario() -> bool:
        waiting = asyncio.get_running_loop().create_task(service.wait("T", 30))
        await asyncio.sleep(0)  # the wait has begun
        service.wake("T")  # a message arrives...
        waiting.cancel()  # ...as the call is cancelled
        await asyncio.wait([waiting], timeout=5)
        return waiting.cancelled()

    assert asyncio.run(scenario())


@pytest.mark.parametrize(("draw", "first_queue"), [(0, 0), (1, 1), (2, 2), (99, 0)])
def test_a_pop_starts_at_the_queue_its_draw_names(
    store: MessageStore, draw: int, first_queue: int
) -> None:
    """PopMessageProcessor draws one number below 100 per pop: the retry topic goes first
    below popFromRetryProbability, and the queues are read from (draw + i) % queues, so
    a busy queue cannot keep the others waiting."""
    store.topics.put(TopicConfig("T3", 3, 3))
    for qid in range(3):
        store.put(MessageExt(topic="T3", queue_id=qid, body=b"q%d" % qid))
    service = PopService(store, "broker-a")
    service._random = types.SimpleNamespace(randrange=lambda n: draw)  # type: ignore[assignment]
    popped = service.pop("G", "T3", 1, 60_000, fifo=False, accepts=lambda m: True, max_attempts=17)
    assert [p.message.queue_id for p in popped] == [first_queue]
