"""SQL92 subscriptions on idemp's client (the Java consumer's MessageSelector.bySql): the
broker filters by the messages' properties; a broker that does not, or an expression it
cannot compile, stops the runner at start with the broker's reason. The same runs were
made against RocketMQ 4.9.7 with enablePropertyFilter=true and without it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import Message
from idemp.remoting import RequestCode
from idemp.runners import ConcurrentRunner
from tests.broker.rawclient import RawClient
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
    "props, expression",
    [({}, "a > 5"), ({"enablePropertyFilter": "true"}, "a >")],
    ids=["broker-does-not-filter", "expression-does-not-compile"],
)
def test_a_subscription_the_broker_refuses_stops_the_start(
    make_broker: Callable[..., BrokerProcess], props: dict[str, str], expression: str
) -> None:
    """The runner fails to start and says what the broker said, word for word (each
    broker words a parse error its own way: tests/broker/test_protocol.py)."""
    broker = make_broker(**props)
    _send(broker, "SqlRefused")
    sub = {"topic": "SqlRefused", "subString": expression, "expressionType": "SQL92"}
    body = {"clientId": "probe", "group": "sql-refused", "subscriptionData": sub}
    with RawClient(broker.broker_addr) as raw:
        answer = raw.request(RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode())
    assert answer.code != 0 and answer.remark
    runner = _runner(broker, "sql-refused", [])
    runner.subscribe("SqlRefused", expression, expression_type="SQL92")
    with pytest.raises(ValueError) as exc:
        runner.start()
    runner.shutdown()
    assert str(exc.value) == (
        f"sql-refused: broker broker-a refuses the SQL92 subscription to SqlRefused "
        f"({expression!r}): {answer.remark} (code {answer.code})"
    )


def test_unknown_expression_types_are_refused_at_subscribe() -> None:
    runner = ConcurrentRunner(
        lambda m: None, settings=ConsumerSettings(group="g"), client=ClientSettings("x:1")
    )
    with pytest.raises(ValueError, match="expression_type 'GROOVY' is not one of TAG, SQL92"):
        runner.subscribe("T", "a > 1", expression_type="GROOVY")
    with pytest.raises(ValueError, match="an SQL92 subscription to T needs an expression"):
        runner.subscribe("T", " ", expression_type="SQL92")
