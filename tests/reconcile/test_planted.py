"""Planted datasets: every class at a known count, from Parquet and JSON lines alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from idemp.reconcile.cli import main
from idemp.reconcile.report import human_size
from tests.reconcile import planted

pytestmark = pytest.mark.spark


def run_cli(paths: dict[str, str], out: Path, *extra: str) -> int:
    return main(
        [
            "--history",
            paths["history"],
            "--records",
            paths["records"],
            "--offsets",
            paths["offsets"],
            "--out",
            str(out),
            "--effects",
            f"{paths['effects']}:order_id:{planted.NS1}",
            "--as-of",
            str(planted.AS_OF),
            "--no-progress",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def dataset() -> tuple[planted.Builder, dict[tuple[str, str], set[str]]]:
    return planted.build()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_planted_counts_exact(spark: Any, tmp_path: Path, dataset: Any, fmt: str) -> None:
    b, expected = dataset
    paths = planted.write(b, tmp_path / "in", fmt)
    out = tmp_path / "out"
    code = run_cli(paths, out)
    assert code == 1  # doubled, lost, stuck, effect_missing are above 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True
    counts = summary["counts"]
    for name, n in planted.CLASS_COUNTS.items():
        assert counts[name] == n, name
    assert counts["unkeyed_messages"] == 2
    assert counts["out_of_scope_records"] == 1
    assert counts["other"] == 1  # inprog-1
    assert counts["keys"] == len(expected)
    assert summary["failed"] == {"doubled": 1, "lost": 4, "stuck": 3, "effect_missing": 1}
    # every key's flags, exactly
    keys = spark.read.parquet(str(out / "keys")).where("in_scope and key is not null")
    names = list(planted.CLASS_COUNTS)
    got = {(r["namespace"], r["key"]): {n for n in names if r[n]} for r in keys.collect()}
    assert got == expected
    # the discrepancy files hold exactly the discrepancy flags
    disc = spark.read.parquet(str(out / "discrepancies"))
    per_class = {
        r["discrepancy"]: r["count"] for r in disc.groupBy("discrepancy").count().collect()
    }
    assert per_class == {
        k: v for k, v in planted.CLASS_COUNTS.items() if k not in ("ok", "duplicate_absorbed")
    }
    # per subscription and day
    per_sub = {(s["group"], s["topic"]): s for s in summary["per_subscription"]}
    assert per_sub[("g2", "payments")]["lost"] == 1
    assert per_sub[("g2", "payments")]["ok"] == 2
    assert per_sub[("g1", "orders")]["lost"] == 3
    days = {(d["group"], d["day"]) for d in summary["per_day"] if d["group"]}
    assert ("g2", "2023-11-15") in days and ("g1", "2023-11-14") in days
    # histogram: deliveries per key
    # dup-1, dup-2, dbl-1, cfl-1, p-dup-1; dlq-1 and lost-2 (message + retry copy)
    assert summary["deliveries_histogram"]["2"] == 7
    assert summary["deliveries_histogram"]["0"] == 3  # the orphans and the orphan effect
    html = (out / "report.html").read_text()
    assert (
        "<svg" in html
        and "lost-1" in html
        and "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )
    # for a person: dates not epoch ms, every class counted (other too), inputs with sizes
    assert "as of 2023-11-14 22:13:20 UTC" in html and str(planted.AS_OF) not in html
    assert '<td class="l">other</td><td>1</td>' in html
    for role in ("history", "records", "offsets", "effects"):
        size = Path(paths[role]).stat().st_size
        assert f'<td class="l">{role}</td>' in html, role
        assert human_size(size) in html, role


def test_thresholds_and_clean_exit(spark: Any, tmp_path: Path, dataset: Any) -> None:
    b, _ = dataset
    paths = planted.write(b, tmp_path / "in", "parquet")
    out = tmp_path / "out"
    code = run_cli(
        paths,
        out,
        "--fail-on",
        "doubled=1",
        "--fail-on",
        "lost=4",
        "--fail-on",
        "stuck=3",
        "--fail-on",
        "effect_missing=1",
    )
    assert code == 0
    code = run_cli(
        paths,
        out,
        "--fail-on",
        "orphan=1",
        "--fail-on",
        "doubled=1",
        "--fail-on",
        "lost=4",
        "--fail-on",
        "stuck=3",
        "--fail-on",
        "effect_missing=1",
        "--no-html",
    )
    assert code == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == {"orphan": 2}
    assert not (out / "report.html").exists()  # the previous run's report was removed


def test_rocketmq5_pop_retries_and_timer_copies(spark: Any, tmp_path: Path) -> None:
    """A 5.x group's POP retries live in %RETRY%<group>_<topic> (told from a 4.x group of
    that name by their 1ST_POP_TIME); a message sent with a delivery time waits in the
    timer topic, and one recalled there is no copy at all."""
    b = planted.Builder()
    t, pop_retry, timer = "t5", "%RETRY%g5_t5", "rmq_sys_wheel_timer"
    first_pop = {"1ST_POP_TIME": "1699920000000"}
    # delivered, then redelivered through the POP retry topic: two deliveries
    mid = b.msg(t, "pop-dup", 0)
    b.msg(pop_retry, "pop-dup", 0, kind="retry", msg_id=mid, retry_topic=t, extra_props=first_pop)
    b.record("g5/t5", "pop-dup", "CONSUMED")
    # received, failed, its retry not yet consumed: pending, not lost
    mid = b.msg(t, "pop-wait", 1)
    b.msg(pop_retry, "pop-wait", 1, kind="retry", msg_id=mid, retry_topic=t, extra_props=first_pop)
    # the same topic name as the 4.x retry topic of a group "g5_t5": not g5's copy
    mid = b.msg(t, "legacy", 2)
    b.msg(pop_retry, "legacy", 2, kind="retry", msg_id=mid, retry_topic=t)
    b.record("g5/t5", "legacy", "CONSUMED")
    # waiting for its delivery time: in flight
    b.msg(timer, "timer-wait", 0, kind="scheduled", real_topic=t)
    # recalled: the marker names "<topic>+<message id>"
    mid = b.msg(timer, "timer-recalled", 1, kind="scheduled", real_topic=t)
    b.msg(timer, None, 2, kind="system", extra_props={"TIMER_DEL_UNIQKEY": f"{t}+{mid}"})
    b.offsets = {"t5@g5": 100, "%RETRY%g5_t5@g5": 1}
    assert _classes_of_keys(spark, b, tmp_path) == {
        "pop-dup": {"duplicate_absorbed"},
        "pop-wait": {"pending"},
        "legacy": {"ok"},
        "timer-wait": {"pending"},
    }


def test_rocketmq5_pop_retries_as_rocketmq_5_3_3_stores_them(spark: Any, tmp_path: Path) -> None:
    """RocketMQ 5.3.3 (measured) writes no RETRY_TOPIC into a POP retry copy, and a dead
    letter that came from one names that retry topic in RETRY_TOPIC: the copies are
    matched to the subscription whose POP retry topic has that name, so a dead-lettered
    key is not taken for lost."""
    b = planted.Builder()
    t, pop_retry, dlq = "t5", "%RETRY%g5_t5", "%DLQ%g5"
    first_pop = {"1ST_POP_TIME": "1699920000000"}
    mid = b.msg(t, "pop-dup", 0)
    b.msg(pop_retry, "pop-dup", 0, kind="retry", msg_id=mid, extra_props=first_pop)
    b.record("g5/t5", "pop-dup", "CONSUMED")
    # failed on every delivery, then dead-lettered from its second POP retry copy
    mid = b.msg(t, "poison", 1)
    b.msg(pop_retry, "poison", 1, kind="retry", msg_id=mid, extra_props=first_pop)
    b.msg(pop_retry, "poison", 2, kind="retry", msg_id=mid, extra_props=first_pop)
    b.msg(dlq, "poison", 0, kind="dlq", msg_id=mid, retry_topic=pop_retry, extra_props=first_pop)
    # received, failed, its retry not yet consumed: pending, not lost
    mid = b.msg(t, "pop-wait", 2)
    b.msg(pop_retry, "pop-wait", 3, kind="retry", msg_id=mid, extra_props=first_pop)
    b.offsets = {"t5@g5": 100, "%RETRY%g5_t5@g5": 3}
    assert _classes_of_keys(spark, b, tmp_path) == {
        "pop-dup": {"duplicate_absorbed"},
        "pop-wait": {"pending"},
        "poison": {"dead_lettered"},
    }


def _classes_of_keys(spark: Any, b: planted.Builder, tmp_path: Path) -> dict[str, set[str]]:
    """Reconcile what ``b`` planted (exit 0 expected); each keyed row's classes."""
    paths = planted.write(b, tmp_path / "in", "parquet")
    out = tmp_path / "out"
    args = ["--history", paths["history"], "--records", paths["records"]]
    args += ["--offsets", paths["offsets"], "--out", str(out)]
    assert main([*args, "--as-of", str(planted.AS_OF), "--no-progress", "--no-html"]) == 0
    keys = spark.read.parquet(str(out / "keys")).where("in_scope and key is not null")
    names = list(planted.CLASS_COUNTS)
    return {r["key"]: {n for n in names if r[n]} for r in keys.collect()}
