"""The real demo end to end, with 300 orders: exact figures (the fault plan is seeded)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from idemp.demo.scenario import make_plan

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_plan_is_deterministic() -> None:
    plan = make_plan(300)
    assert (plan.expected_effects, plan.messages) == (1800, 1838)
    assert (plan.producer_retries, plan.shuffled_orders, plan.poison) == (37, 10, 1)
    assert (plan.dispatch_orders, plan.trips_orders) == (150, 150)


def test_demo_300_orders(tmp_path: Path) -> None:
    report = tmp_path / "report"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    proc = subprocess.run(
        [sys.executable, "-m", "idemp", "demo", "--orders", "300", "--report-dir", str(report)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-4000:]
    assert "producer retries (same key, new msgId): 37 extra sends" in out
    assert "out-of-order sends: 10 dispatch orders sent shuffled" in out
    assert (
        "effects 1800 (expected 1800), doubled 0, lost 0, unexpected 0, order violations 0"
    ) in out
    assert (
        "keys 1801 (expected 1801), messages 1838 (sent 1838), doubled 0, lost 0, "
        "dead-lettered 1, exit 0"
    ) in out
    assert out.rstrip().splitlines()[-2] == (
        "demo OK: exactly-once effects and per-order state order hold"
    )
    summary = json.loads((report / "summary.json").read_text())
    c = summary["counts"]
    assert (c["keys"], c["messages"], c["doubled"], c["lost"], c["stuck"]) == (1801, 1838, 0, 0, 0)
    assert (c["dead_lettered"], c["effect_missing"], c["record_missing"], c["conflict"]) == (
        1,
        0,
        0,
        0,
    )
    assert (report / "report.html").is_file()
