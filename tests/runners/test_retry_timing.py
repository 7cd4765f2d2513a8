"""When a message a listener did not ack comes back: ``ReconsumeLater`` and the group's
``retry_delay_level`` (the Java listener's ``delayLevelWhenNextConsume`` and
``suspendCurrentQueueTimeMillis``), and a guard's ``hold_retry``.

The broker runs with delay levels that tell the levels apart: level 1 is 1 s, level 2
is 2 s and every other level an hour. A send-back at level N is stored in queue N-1 of
``SCHEDULE_TOPIC_XXXX`` (RocketMQ's delay queue), which the store's history shows; a
message that comes back within the test's wait was sent back at level 1 or 2."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idemp import ConsumeResult, Message, ReconsumeLater, guarded, stats
from idemp.broker.export import rows
from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.guards import RIDE_HAILING_ORDER, CallableStateStore
from idemp.message import answer_of
from idemp.outcome import Outcome, Result
from idemp.runners import ConcurrentRunner, OrderlyRunner
from tests.broker.rawclient import RawClient
from tests.client.conftest import wait_for
from tests.runners.conftest import memory_states

LEVELS = " ".join(["1s", "2s"] + ["1h"] * 16)
SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def _schedule_queues(store: Path) -> dict[str, int]:
    """keys → the delay queue its send-back was stored in (level - 1)."""
    stored = rows(store, with_body=False)
    return {r["keys"]: r["queue_id"] for r in stored if r["topic"] == SCHEDULE}


def _runner(
    cls: type[ConcurrentRunner] | type[OrderlyRunner],
    listener: Callable[[Message], Any],
    broker: BrokerProcess,
    group: str,
    topic: str,
    **settings: Any,
) -> ConcurrentRunner | OrderlyRunner:
    runner = cls(
        listener,
        settings=ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET, **settings),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0),
    )
    runner.subscribe(topic)
    return runner


@pytest.mark.parametrize(
    ("group_level", "queues", "back"),
    [
        # the broker's schedule for a plain retry: level 3 + reconsume times (an hour here)
        (0, {"a": 0, "b": 1, "c": 2, "d": 2}, {"a", "b"}),
        # the group's level for a plain retry and a raise; a message's own level wins
        (1, {"a": 0, "b": 1, "c": 0, "d": 0}, {"a", "b", "c", "d"}),
    ],
)
def test_concurrent_send_back_at_the_level_asked(
    group_level: int,
    queues: dict[str, int],
    back: set[str],
    make_broker: Callable[..., BrokerProcess],
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    broker = make_broker(store=store, messageDelayLevel=LEVELS)
    topic, group = f"Later{group_level}", f"later-{group_level}"
    seen: list[tuple[str, int]] = []

    def listener(message: Message) -> Any:
        key = message.key or ""
        seen.append((key, message.reconsume_times))
        if message.reconsume_times:
            return None
        if key == "d":
            raise RuntimeError("d fails")
        return {
            "a": ReconsumeLater(delay_level=1),
            "b": ReconsumeLater(delay_level=2),
            "c": ConsumeResult.RECONSUME_LATER,
        }[key]

    producer = Producer(broker.namesrv_addr, f"{group}-p").start()
    runner = _runner(
        ConcurrentRunner, listener, broker, group, topic, retry_delay_level=group_level
    )
    try:
        for key in "abcd":
            producer.send(OutMessage(topic, key.encode(), keys=[key]))
        runner.start()
        wait_for(lambda: len(_schedule_queues(store)) == 4, 30, "four send-backs")
        wait_for(lambda: {k for k, n in seen if n == 1} == back, 30, f"{sorted(back)} back")
    finally:
        runner.shutdown()
        producer.shutdown()
    assert _schedule_queues(store) == queues
    assert sorted(seen) == sorted([(k, 0) for k in "abcd"] + [(k, 1) for k in back])


def test_orderly_suspends_the_queue_as_long_as_asked(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = make_broker(store=tmp_path / "store")
    topic, group = "LaterOrderly", "later-orderly"
    tries: list[float] = []

    def listener(message: Message) -> Any:
        tries.append(time.monotonic())
        # the runner's own suspension is 1 s: the second try, 3 s on, is the message's
        return ReconsumeLater(after=3.0) if len(tries) == 1 else None

    producer = Producer(broker.namesrv_addr, f"{group}-p").start()
    runner = _runner(OrderlyRunner, listener, broker, group, topic)
    try:
        producer.send_orderly(OutMessage(topic, b"x", keys=["x"]), "q")
        runner.start()
        wait_for(lambda: len(tries) == 2, 30, "the second try")
    finally:
        runner.shutdown()
        producer.shutdown()
    assert tries[1] - tries[0] >= 3.0


def test_a_held_transition_comes_back_at_the_guards_level(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    broker = make_broker(store=store, messageDelayLevel=LEVELS)
    topic, group, name = "LaterRides", "later-rides", "later-rides"
    _, states = memory_states()
    applied: list[str] = []

    @guarded(
        RIDE_HAILING_ORDER,
        entity="json:order",
        target="json:state",
        store=states,
        hold_retry=ReconsumeLater(delay_level=1),
        name=name,
    )
    def on_transition(message: Message) -> None:
        applied.append(json.loads(message.body)["state"])

    def send(state: str) -> None:
        body = json.dumps({"order": "o1", "state": state}).encode()
        producer.send(OutMessage(topic, body, keys=[f"o1-{state}"]))

    producer = Producer(broker.namesrv_addr, f"{group}-p").start()
    runner = _runner(ConcurrentRunner, on_transition, broker, group, topic)
    try:
        send("driver_assigned")  # ahead of its order's creation: held
        runner.start()
        wait_for(lambda: _schedule_queues(store), 30, "the held transition sent back")
        send("created")
        # back after a second (level 1), not the hour of the broker's schedule
        wait_for(lambda: len(applied) == 2, 30, "both transitions applied")
    finally:
        runner.shutdown()
        producer.shutdown()
    assert applied == ["created", "driver_assigned"]
    assert _schedule_queues(store) == {"o1-driver_assigned": 0}
    assert stats(name)["held"] >= 1


def test_answers_keep_the_timing_of_a_retry() -> None:
    later = ReconsumeLater(delay_level=4, after=2.5)
    assert answer_of(later) is later
    assert later.consume_result is ConsumeResult.RECONSUME_LATER
    message = Message("T", b"")
    held = Result(Outcome.HELD, message, retry=later)
    assert answer_of(held) is later
    # an acked result keeps no retry; a plain one is the plain enum
    assert answer_of(Result(Outcome.PROCESSED, message, retry=later)) is ConsumeResult.SUCCESS
    assert answer_of(Result(Outcome.FAILED, message)) is ConsumeResult.RECONSUME_LATER
    assert answer_of(False) is ConsumeResult.RECONSUME_LATER
    assert answer_of(None) is ConsumeResult.SUCCESS


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"delay_level": -1}, "delay_level=-1"),
        ({"delay_level": 1.5}, "delay_level=1.5"),
        ({"delay_level": True}, "delay_level=True"),
        ({"after": 0}, "after=0"),
        ({"after": "1s"}, "after='1s'"),
    ],
)
def test_a_bad_retry_is_refused_naming_what(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=f"ReconsumeLater\\({named}\\)"):
        ReconsumeLater(**kwargs)


def test_bad_retry_settings_fail_at_construction() -> None:
    with pytest.raises(ValueError, match=r"retry_delay_level=-1"):
        ConcurrentRunner(
            lambda m: None,
            settings=ConsumerSettings(group="g", retry_delay_level=-1),
            client=ClientSettings(namesrv_addr="127.0.0.1:1"),
        )
    with pytest.raises(TypeError, match=r"hold_retry=5"):
        guarded(
            RIDE_HAILING_ORDER,
            entity="json:order",
            target="json:state",
            store=CallableStateStore(load=lambda e: None, save=lambda e, s, t: True),
            hold_retry=5,  # type: ignore[arg-type]
        )


def test_a_concurrent_groups_minus_one_is_javas_sixteen(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """``max_reconsume_times=-1`` is Java's default: 16 for a concurrent consumer (its
    send-back says 16), forever only for an orderly one. A message on its 17th delivery
    (16 reconsumes, in the group's retry topic) that fails goes to the DLQ."""
    store = tmp_path / "store"
    broker = make_broker(store=store)
    topic, group = "MinusOne", "minus-one"
    seen: list[int] = []

    def listener(message: Message) -> Any:
        seen.append(message.reconsume_times)
        return ConsumeResult.RECONSUME_LATER

    runner = _runner(ConcurrentRunner, listener, broker, group, topic, max_reconsume_times=-1)
    try:
        runner.start()  # its heartbeat makes %RETRY%minus-one
        with RawClient(broker.broker_addr) as raw:
            sent = raw.send_message(
                f"%RETRY%{group}",
                b"x",
                {"KEYS": "k16", "RETRY_TOPIC": topic},
                extra={"reconsumeTimes": 16, "maxReconsumeTimes": 32},
            )
            assert sent.code == 0, sent.remark
        dlq = f"%DLQ%{group}"
        wait_for(
            lambda: any(r["topic"] == dlq for r in rows(store, with_body=False)), 30, "the DLQ"
        )
    finally:
        runner.shutdown()
    assert seen == [16]
