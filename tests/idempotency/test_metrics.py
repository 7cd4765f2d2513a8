"""The counters as Prometheus metrics: every event counted by ``idemp.stats`` is also the
labelled counter ``idemp_events_total`` in prometheus-client's default registry."""

from __future__ import annotations

import uuid
from pathlib import Path

from prometheus_client import REGISTRY

from idemp import Message, Outcome, idempotent, stats
from idemp.strategies import UniqueKeyTable


def _sample(listener: str, event: str) -> float:
    value = REGISTRY.get_sample_value("idemp_events_total", {"listener": listener, "event": event})
    return value or 0.0


def test_outcomes_are_prometheus_counters(tmp_path: Path):
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    strategy = UniqueKeyTable(f"sqlite:///{tmp_path / 'm.db'}")

    @idempotent(key="keys", strategy=strategy, namespace="g/Orders", name=name)
    def handle(message: Message) -> None:
        if message.body == b"boom":
            raise RuntimeError("handler failed")

    def msg(key: str, body: bytes = b"{}") -> Message:
        return Message("Orders", body, keys=(key,), msg_id=uuid.uuid4().hex)

    outcomes = [handle(msg(k)).outcome for k in ("a", "b", "c", "a", "b")]
    outcomes.append(handle(msg("d", b"boom")).outcome)
    outcomes.append(handle(msg("e", b"boom")).outcome)
    batch = idempotent.batch(key="keys", strategy=strategy, namespace="g/Orders", name=name)(
        lambda messages: None
    )
    batch_outcomes = [r.outcome for r in batch([msg("f"), msg("g"), msg("a")]).results]

    assert outcomes == [Outcome.PROCESSED] * 3 + [Outcome.DUPLICATE] * 2 + [Outcome.FAILED] * 2
    assert batch_outcomes == [Outcome.PROCESSED, Outcome.PROCESSED, Outcome.DUPLICATE]
    counted = stats(name)
    assert (counted["processed"], counted["duplicates"], counted["failures"]) == (5, 3, 2)
    for event, value in counted.items():
        assert _sample(name, event) == value, event
    strategy.close()
