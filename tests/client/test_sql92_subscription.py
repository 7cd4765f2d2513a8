"""SQL92 subscriptions on idemp's client (the Java consumer's MessageSelector.bySql): the
broker filters by the messages' properties; a broker that does not, or an expression it
cannot compile, stops the runner at start with the broker's reason. The same runs were
made against RocketMQ 4.9.7 with enablePropertyFilter=true and without it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import Message
from idemp.runners import ConcurrentRunner
from tests.client.conftest import wait_for


def _runner(broker: BrokerProcess, group: str, seen: list[Message]) -> ConcurrentRunner:
    return ConcurrentRunner(
        seen.append,  # list.append is atomic: the consume threads need no lock
        settings=ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr),
    )


def _send(broker: BrokerProcess, topic: str) -> None:
    producer = Producer(broker.namesrv_addr, "sql-p").start()
    try:
        for a, tag in [("3", "A"), ("10", "B"), ("7", "A"), ("x", "A"), (None, "A")]:
            props = {} if a is None else {"a": a}
            producer.send(OutMessage(topic, f"a={a}".encode(), tags=tag, properties=props))
    finally:
        producer.shutdown()


def test_the_broker_delivers_what_the_selector_selects(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    broker = make_broker(enablePropertyFilter="true")
    _send(broker, "SqlT")
    seen: list[Message] = []
    runner = _runner(broker, "sql-g", seen)
    runner.subscribe("SqlT", "a > 5 OR a IS NULL", expression_type="SQL92")
    runner.start()
    try:
        wait_for(lambda: len(seen) >= 3, 30, "the three matching messages")
        assert sorted(m.body for m in seen) == [b"a=10", b"a=7", b"a=None"]
    finally:
        runner.shutdown()


@pytest.mark.parametrize(
    "props, expression, reason",
    [
        ({}, "a > 5", "The broker does not support consumer to filter message by SQL92"),
        ({"enablePropertyFilter": "true"}, "a >", "invalid SQL92 selector at column 4"),
    ],
    ids=["broker-does-not-filter", "expression-does-not-compile"],
)
def test_a_subscription_the_broker_refuses_stops_the_start(
    make_broker: Callable[..., BrokerProcess], props: dict[str, str], expression: str, reason: str
) -> None:
    broker = make_broker(**props)
    _send(broker, "SqlRefused")
    runner = _runner(broker, "sql-refused", [])
    runner.subscribe("SqlRefused", expression, expression_type="SQL92")
    with pytest.raises(ValueError, match="refuses the SQL92 subscription to SqlRefused") as exc:
        runner.start()
    assert reason in str(exc.value)
    runner.shutdown()


def test_unknown_expression_types_are_refused_at_subscribe() -> None:
    runner = ConcurrentRunner(
        lambda m: None, settings=ConsumerSettings(group="g"), client=ClientSettings("x:1")
    )
    with pytest.raises(ValueError, match="expression_type 'GROOVY' is not one of TAG, SQL92"):
        runner.subscribe("T", "a > 1", expression_type="GROOVY")
    with pytest.raises(ValueError, match="an SQL92 subscription to T needs an expression"):
        runner.subscribe("T", " ", expression_type="SQL92")
