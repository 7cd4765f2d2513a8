"""The Java client's namespace (ClientConfig.setNamespace) on idemp's client: topics and
groups go on the wire as ``<namespace>%<name>`` (so a Java service's namespaced
producers and consumers share them), while the code that sends and listens names them
plain, as a namespaced Java client's does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idemp import Message
from idemp.broker.export import rows
from idemp.broker.process import BrokerProcess
from idemp.client import (
    ClientSettings,
    ConsumeFrom,
    ConsumerSettings,
    OutMessage,
    Producer,
    ProducerSettings,
)
from idemp.runners import ConcurrentRunner
from tests.client.conftest import FAST_DELAYS, wait_for


def test_names_carry_the_namespace_on_the_wire_only(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    broker = make_broker(store=store, messageDelayLevel=FAST_DELAYS)
    client = ClientSettings(
        namesrv_addr=broker.namesrv_addr, namespace="ns1", rebalance_interval=1.0
    )
    producer = Producer(settings=ProducerSettings(group="shop"), client=client).start()
    seen: list[tuple[str, int, str | None]] = []
    audited: list[str] = []

    def billing(message: Message) -> Any:
        seen.append((message.topic, message.reconsume_times, message.consumer_group))
        return message.reconsume_times > 0  # each fails once: back through the retry topic

    def audit(message: Message) -> None:
        audited.append(message.topic)

    first = ConsumeFrom.FIRST_OFFSET
    runner = ConcurrentRunner(
        billing, settings=ConsumerSettings(group="billing", consume_from=first), client=client
    )
    runner.subscribe("Orders")
    # a client without a namespace names the topic as the broker stores it
    plain = ConcurrentRunner(
        audit,
        settings=ConsumerSettings(group="audit", consume_from=first),
        client=ClientSettings(namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0),
    )
    plain.subscribe("ns1%Orders")
    try:
        result = producer.send(OutMessage("Orders", b"o1", keys=["o1"]))
        assert result.queue.topic == "Orders"
        assert {q.topic for q in producer.publish_queues("Orders")} == {"Orders"}
        batch = producer.send_batch([OutMessage("Orders", b"b", keys=["b"])])
        assert batch.queue.topic == "Orders"
        runner.start()
        plain.start()
        wait_for(lambda: len(seen) == 4 and len(audited) == 2, 30, "two retried, the audit")
    finally:
        runner.shutdown()
        plain.shutdown()
        producer.shutdown()
    assert sorted(seen) == [("Orders", 0, "billing")] * 2 + [("Orders", 1, "billing")] * 2
    assert audited == ["ns1%Orders", "ns1%Orders"]
    stored = {r["topic"] for r in rows(store, with_body=False)}
    assert {"ns1%Orders", "%RETRY%ns1%billing"} <= stored
    assert not stored & {"Orders", "%RETRY%billing"}


@pytest.mark.parametrize("bad", ["a%b", "a b", "ns/1"])
def test_a_namespace_the_wire_cannot_carry_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=f"namespace {bad!r}: letters, digits"):
        ClientSettings(namesrv_addr="127.0.0.1:1", namespace=bad)
