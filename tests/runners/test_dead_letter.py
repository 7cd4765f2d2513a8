"""A guarded transition held ``max_holds`` times is kept, not lost (issue 12 §5): the
runner sends it to the group's ``%DLQ%`` (send-back with delay level -1), where the
history export, and so the reconciliation, sees it as a dead letter (kind ``dlq``,
``retry_topic`` the original topic)."""

from __future__ import annotations

import json
from base64 import b64decode
from collections.abc import Callable
from pathlib import Path

import pytest

from idemp import Message, guarded, stats
from idemp.broker.export import rows
from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.guards import RIDE_HAILING_ORDER
from idemp.runners import ConcurrentRunner, OrderlyRunner
from tests.client.conftest import FAST_DELAYS, wait_for
from tests.runners.conftest import memory_states

TOPIC = "Rides"


def _body(order: str, state: str) -> bytes:
    return json.dumps({"order": order, "state": state}).encode()


@pytest.mark.parametrize("runner_cls", [ConcurrentRunner, OrderlyRunner])
def test_transition_held_too_long_goes_to_the_dlq(
    runner_cls: type[ConcurrentRunner] | type[OrderlyRunner],
    make_broker: Callable[..., BrokerProcess],
    tmp_path: Path,
) -> None:
    store_dir = tmp_path / "store"
    broker = make_broker(store=store_dir, messageDelayLevel=FAST_DELAYS)
    group = f"rides-{runner_cls.__name__.lower()}"
    name = f"dlq-{group}"
    states, store = memory_states()
    applied: list[tuple[str, str]] = []

    # max_holds=0: the first hold is already one too many (the default policy applies).
    @guarded(
        RIDE_HAILING_ORDER,
        entity="json:order",
        target="json:state",
        store=store,
        max_holds=0,
        name=name,
    )
    def on_transition(message: Message) -> None:
        data = json.loads(message.body)
        applied.append((data["order"], data["state"]))

    producer = Producer(broker.namesrv_addr, f"{group}-producer").start()
    runner = runner_cls(
        on_transition,
        settings=ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0),
    )
    runner.subscribe(TOPIC)
    try:
        # One queue (a sharding key), so the orderly runner must move past the dead letter.
        for order, state in (("o1", "driver_assigned"), ("o2", "created"), ("o3", "created")):
            producer.send_orderly(OutMessage(TOPIC, _body(order, state), keys=[order]), "q")
        runner.start()
        wait_for(lambda: runner.dlq_count == 1 and len(applied) == 2, 60, "two applied, one DLQ")
    finally:
        runner.shutdown()
        producer.shutdown()

    assert sorted(applied) == [("o2", "created"), ("o3", "created")]
    assert states == {"o2": "created", "o3": "created"}
    counted = stats(name)
    assert counted["dead_lettered"] == 1 and counted["guard_drops"] == 0
    dead = [r for r in rows(store_dir, with_body=True) if r["topic"] == f"%DLQ%{group}"]
    assert len(dead) == 1
    assert dead[0]["kind"] == "dlq" and dead[0]["retry_topic"] == TOPIC
    assert (
        dead[0]["keys"] == "o1"
        and json.loads(b64decode(dead[0]["body"]))["state"] == "driver_assigned"
    )
