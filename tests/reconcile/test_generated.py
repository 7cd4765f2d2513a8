"""A generated history of 1,000,000 messages with injected faults: counts exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.reconcile import AS_OF, GROUP, NS, TOPIC, generate
from idemp.reconcile import report
from idemp.reconcile.job import JobConfig, Subscription
from idemp.reconcile.loaders import (
    EffectSource,
    load_effects,
    load_history,
    load_offsets,
    load_sql_records,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_million_messages_counts_exact(spark: Any, tmp_path: Path) -> None:
    expected = generate(1_000_000, tmp_path / "in")
    d = tmp_path / "in"
    cfg = JobConfig([Subscription.of(GROUP, TOPIC)], AS_OF, effect_namespaces=frozenset([NS]))
    outcome = report.run(
        spark,
        load_history(spark, d / "history.parquet"),
        load_sql_records(spark, d / "records.parquet"),
        load_effects(spark, EffectSource(str(d / "effects.parquet"), "order_id"), NS),
        load_offsets(d / "consumerOffset.json").to_spark(spark),
        cfg,
        tmp_path / "out",
        progress=False,
        html_report=False,
    )
    counts = outcome.summary["counts"]
    assert {k: counts[k] for k in expected} == expected
    assert outcome.exit_code == 1
    assert outcome.failed == {"doubled": 500, "lost": 1000, "stuck": 300, "effect_missing": 200}
