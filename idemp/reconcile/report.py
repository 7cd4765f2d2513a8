"""Run the job and write its outputs: Parquet, JSON summary, HTML, terminal summary.

Output directory layout::

    keys/              every (namespace, key) with its counts, flags and class
    discrepancies/     one row per (key, discrepancy), partitioned by discrepancy=
    totals/            per (group, topic, day) counts and the deliveries histogram
    summary.json       written last, with "complete": true
    report.html        self-contained (inline CSS and SVG)

A previous run's ``summary.json``/``report.html`` are removed first and written only
after every Parquet output succeeded, so a failed run never leaves a report that
looks complete; it writes ``error.json`` instead.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .job import JobConfig, classify, discrepancies, totals
from .schemas import (
    BENIGN_CLASSES,
    DEFAULT_FAIL_ON,
    DISCREPANCY_CLASSES,
    HISTOGRAM_BUCKETS,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SAMPLE_ROWS = 5
COUNT_NAMES = (
    ["keys", "messages", "deliveries", "unkeyed_messages", "out_of_scope_records", "other"]
    + DISCREPANCY_CLASSES
    + BENIGN_CLASSES
)
SAMPLE_COLUMNS = [
    "group",
    "topic",
    "key",
    "day",
    "n_messages",
    "n_deliveries",
    "n_dlq",
    "n_outstanding",
    "status",
    "n_records",
    "n_effects",
    "first_ts",
]


@dataclass
class Outcome:
    summary: dict[str, Any]
    exit_code: int
    out_dir: Path
    failed: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------


class Progress:
    """A tqdm bar over the job's steps; while a step runs, a thread polls Spark's
    status tracker and shows the active stages' finished/total tasks."""

    def __init__(
        self, spark: SparkSession, steps: int, enabled: bool = True, stream: TextIO | None = None
    ) -> None:
        from tqdm import tqdm

        self.spark = spark
        self.bar = tqdm(
            total=steps,
            disable=not enabled,
            file=stream or sys.stderr,
            unit="step",
            leave=False,
            dynamic_ncols=True,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.bar.set_description(name)
        self._stop.clear()
        if not self.bar.disable:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            self.bar.update(1)

    def _poll(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.wait(0.5):
            try:
                done = total = 0
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
                self.bar.set_postfix_str(f"tasks {done}/{total}" if total else "")
            except Exception:  # the gateway may be shutting down
                return

    def close(self) -> None:
        self.bar.close()


# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------


# The per-key aggregate has about as many groups as input rows (a key has one or two
# copies): a map-side partial aggregate would reduce nothing and cost a hash map per
# task, so the rows are shuffled as they are (Spark 4's switch; older versions ignore
# it). Only for that step: the totals aggregate has few groups and keeps it.
PER_KEY_CONF = {"spark.sql.execution.bypassPartialAggregation": "true"}


@contextmanager
def sql_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """Set runtime SQL options for one step, then restore them (the session is shared)."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in before.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def clear_outputs(out: Path) -> None:
    """Remove a previous run's outputs, so none can pass for this run's."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "report.html", "error.json"):
        (out / name).unlink(missing_ok=True)
    for name in ("keys", "discrepancies", "totals"):
        shutil.rmtree(out / name, ignore_errors=True)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def write_error(out: Path, exc: BaseException) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write_json(
        out / "error.json", {"complete": False, "error": str(exc), "type": type(exc).__name__}
    )


def run(
    spark: SparkSession,
    history: DataFrame,
    records: DataFrame,
    effects: DataFrame | None,
    offsets: DataFrame,
    cfg: JobConfig,
    out: str | Path,
    *,
    fail_on: Mapping[str, int] | None = None,
    inputs: Mapping[str, Any] | None = None,
    progress: bool = True,
    html_report: bool = True,
) -> Outcome:
    """Classify, write every output, and return the summary and the exit code."""
    out = Path(out)
    clear_outputs(out)
    thresholds = dict(DEFAULT_FAIL_ON if fail_on is None else fail_on)
    bar = Progress(spark, 4, enabled=progress)
    started = time.monotonic()
    try:
        # One pass over the inputs: every key classified and written once; the other
        # outputs are read back from that Parquet (only the columns they need), so no
        # per-key work is repeated and nothing per key reaches the driver.
        with bar.step("classify keys"), sql_conf(spark, PER_KEY_CONF):
            classified = classify(spark, history, records, effects, offsets, cfg)
            classified.write.mode("overwrite").parquet(str(out / "keys"))
        # the schema is known: reading back needs no footer-reading job
        keys = spark.read.schema(classified.schema).parquet(str(out / "keys"))
        with bar.step("totals"):
            tot = totals(keys)
            total_rows = sorted(
                (r.asDict() for r in tot.collect()),  # one row per (group, topic, day)
                key=lambda r: (
                    r["group"] is not None,
                    r["group"] or "",
                    r["topic"] or "",
                    r["day"] is not None,
                    r["day"] or "",
                ),
            )
            spark.createDataFrame(
                [tuple(r[f] for f in tot.columns) for r in total_rows], tot.schema
            ).coalesce(1).write.mode("overwrite").parquet(str(out / "totals"))
        with bar.step("discrepancies"):
            discrepancies(keys).write.mode("overwrite").partitionBy("discrepancy").parquet(
                str(out / "discrepancies")
            )
        with bar.step("samples"):
            samples = _samples(spark, out / "discrepancies", total_rows)
    finally:
        bar.close()
    summary = build_summary(total_rows, samples, thresholds, cfg, inputs or {})
    summary["seconds"] = round(time.monotonic() - started, 3)
    failed = summary["failed"]
    if html_report:
        (out / "report.html").write_text(render_html(summary), encoding="utf-8")
    _write_json(out / "summary.json", summary)
    return Outcome(summary, 1 if failed else 0, out, failed)


def _samples(
    spark: SparkSession, disc: Path, total_rows: list[dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    from pyspark.sql import functions as F

    present = [n for n in DISCREPANCY_CLASSES if any(r[n] for r in total_rows)]
    out: dict[str, list[dict[str, Any]]] = {}
    if not present:
        return out
    from functools import reduce

    df = spark.read.parquet(str(disc))
    # one job for every class: the directory of each class is pruned by its partition
    per_class = [
        df.where(F.col("discrepancy") == name)
        .select(F.col("discrepancy").alias("_class"), *SAMPLE_COLUMNS)
        .limit(SAMPLE_ROWS)
        for name in present
    ]
    for row in reduce(lambda a, b: a.unionByName(b), per_class).collect():
        d = row.asDict()
        out.setdefault(d.pop("_class"), []).append(d)
    return {name: out.get(name, []) for name in present}


def build_summary(
    total_rows: list[dict[str, Any]],
    samples: dict[str, list[dict[str, Any]]],
    thresholds: Mapping[str, int],
    cfg: JobConfig,
    inputs: Mapping[str, Any],
) -> dict[str, Any]:
    overall = {n: sum(int(r[n] or 0) for r in total_rows) for n in COUNT_NAMES}
    per_sub: dict[tuple[str, str], dict[str, int]] = {}
    for r in total_rows:
        if r["group"] is None:
            continue
        acc = per_sub.setdefault((r["group"], r["topic"]), dict.fromkeys(COUNT_NAMES, 0))
        for n in COUNT_NAMES:
            acc[n] += int(r[n] or 0)
    histogram = {
        (f"{i}+" if i == HISTOGRAM_BUCKETS else str(i)): sum(
            int(r[f"deliveries_{i}"] or 0) for r in total_rows
        )
        for i in range(0, HISTOGRAM_BUCKETS + 1)
    }
    failed = {k: overall[k] for k, limit in thresholds.items() if overall.get(k, 0) > limit}
    return {
        "complete": True,
        "as_of_ms": cfg.as_of_ms,
        "key_from": cfg.key_from,
        "subscriptions": [
            {
                "group": s.group,
                "topic": s.topic,
                "namespace": s.namespace,
                "effects_measured": s.namespace in cfg.effect_namespaces,
            }
            for s in cfg.subscriptions
        ],
        "inputs": dict(inputs),
        "counts": overall,
        "per_subscription": [
            {"group": g, "topic": t, **c} for (g, t), c in sorted(per_sub.items())
        ],
        "per_day": [
            {
                k: (str(v) if k == "day" else v)
                for k, v in r.items()
                if not k.startswith("deliveries_")
            }
            for r in total_rows
        ],
        "deliveries_histogram": histogram,
        "thresholds": dict(thresholds),
        "failed": failed,
        "samples": samples,
    }


# ---------------------------------------------------------------------------------------
# terminal
# ---------------------------------------------------------------------------------------


def format_terminal(summary: Mapping[str, Any], out_dir: Path | str) -> str:
    c = summary["counts"]
    lines = [
        f"idemp reconcile: {c['keys']} keys, {c['messages']} messages, "
        f"{c['deliveries']} deliveries",
    ]
    for s in summary["per_subscription"]:
        lines.append(
            f"  {s['group']} <- {s['topic']}: {s['keys']} keys, ok {s['ok']}, "
            f"duplicates absorbed {s['duplicate_absorbed']}"
        )
    width = max(len(n) for n in COUNT_NAMES)
    for name in BENIGN_CLASSES + DISCREPANCY_CLASSES:
        mark = " !" if name in summary["failed"] else ""
        lines.append(f"  {name:<{width}} {c[name]:>12}{mark}")
    for extra in ("unkeyed_messages", "out_of_scope_records", "other"):
        if c[extra]:
            lines.append(f"  {extra:<{width}} {c[extra]:>12}")
    if summary["failed"]:
        over = ", ".join(
            f"{k}={v} (> {summary['thresholds'][k]})" for k, v in summary["failed"].items()
        )
        lines.append(f"FAILED: {over}")
    else:
        lines.append("OK: no class above its threshold")
    lines.append(f"report: {Path(out_dir) / 'report.html'}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;
text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}
.bad{color:#b00;font-weight:600}.good{color:#070;font-weight:600}.muted{color:#777}
.banner{padding:.6em 1em;border-radius:4px}.banner.bad{background:#fdecea}
.banner.good{background:#e9f7ef}code{font-size:.95em}
.scroll{overflow-x:auto;max-width:100%}
"""

# What an empty cell means, per column (shown under the tables that have such cells).
EMPTY_CELLS = {
    "status": "no dedup record for the key",
    "n_effects": "effects not measured for this subscription (no --effects for it)",
    "first_ts": "no message of the key in the history",
    "day": "neither a message nor a record carries a time",
    "group": "a record or effect that matches no subscription",
    "topic": "a record or effect that matches no subscription",
}

OTHER_DESCRIPTION = (
    "in none of the classes above (e.g. a record CONSUMING before its deadline with every "
    "copy acknowledged)"
)

DESCRIPTIONS = {
    "ok": "one delivery, one effect",
    "duplicate_absorbed": "several deliveries, one effect",
    "doubled": "more than one effect row for one key",
    "lost": "every copy acknowledged, no CONSUMED record, no effect",
    "effect_missing": "CONSUMED record but no effect row",
    "stuck": "CONSUMING past its deadline",
    "conflict": "one key, different payload fingerprints",
    "dead_lettered": "a copy is in %DLQ%",
    "record_missing": "effect present, no dedup record",
    "orphan": "dedup record with no message in the history window",
    "orphan_effect": "effect rows with no message and no dedup record",
    "pending": "not yet acknowledged (lag, not loss)",
}


def _svg_histogram(hist: Mapping[str, int]) -> str:
    items = [(k, v) for k, v in hist.items() if k != "0"]
    w, h, pad = 560, 220, 40
    top = max([v for _, v in items] + [1])
    bw = (w - 2 * pad) / max(len(items), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'role="img" aria-label="deliveries per key">'
    ]
    parts.append(f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#999"/>')
    for i, (label, v) in enumerate(items):
        bh = (h - 2 * pad) * (v / top) if v else 0
        x = pad + i * bw + 4
        y = h - pad - bh
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw - 8:.1f}" height="{bh:.1f}" '
            f'fill="{"#4a7ebb" if label == "1" else "#e0a030"}"><title>{label} '
            f"deliveries: {v} keys</title></rect>"
        )
        parts.append(
            f'<text x="{x + (bw - 8) / 2:.1f}" y="{h - pad + 15}" font-size="11" '
            f'text-anchor="middle">{label}</text>'
        )
        parts.append(
            f'<text x="{x + (bw - 8) / 2:.1f}" y="{y - 4:.1f}" font-size="10" '
            f'text-anchor="middle">{v}</text>'
        )
    parts.append(
        f'<text x="{w / 2}" y="{h - 6}" font-size="11" text-anchor="middle">'
        "deliveries per key</text></svg>"
    )
    return "".join(parts)


def utc_time(ms: int | None) -> str:
    """Epoch milliseconds as a date and time a person reads (UTC, to the second)."""
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def human_size(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def describe_input(source: str, shown: str | None = None) -> dict[str, Any]:
    """What the report says about one input: its name as given (a URL with its secret
    masked), its size and modification time when it is a file or directory, so the report
    stays meaningful after the files are gone."""
    item: dict[str, Any] = {"source": shown if shown is not None else source}
    path = Path(source)
    try:
        if path.is_file():
            st = path.stat()
            item["bytes"] = st.st_size
            item["modified_ms"] = int(st.st_mtime * 1000)
        elif path.is_dir():
            files = [f for f in path.rglob("*") if f.is_file()]
            item["bytes"] = sum(f.stat().st_size for f in files)
            item["modified_ms"] = int(max((f.stat().st_mtime for f in files), default=0) * 1000)
    except OSError:
        pass
    return item


def _cell(col: str, value: Any) -> str:
    if value is None:
        return "–"
    if col.endswith("_ts") or col.endswith("_ms"):
        return utc_time(int(value))
    return str(value)


def _table(rows: list[Mapping[str, Any]], cols: list[str]) -> str:
    """A table that scrolls inside the page when wide; an empty cell shows "–" and the
    note under the table says what it means for that column."""
    e = html.escape
    head = "".join(f'<th class="l">{e(c)}</th>' for c in cols)
    body = "".join(
        "<tr>" + "".join(f'<td class="l">{e(_cell(c, r.get(c)))}</td>' for c in cols) + "</tr>"
        for r in rows
    )
    empty = [c for c in cols if any(r.get(c) is None for r in rows)]
    note = "".join(f"<br><code>{e(c)}</code> –: {e(EMPTY_CELLS.get(c, 'no value'))}" for c in empty)
    note_html = f'<p class="muted">{note[4:]}</p>' if note else ""
    return f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>{note_html}'


def _inputs_table(inputs: Mapping[str, Any]) -> str:
    rows = []
    for role, items in inputs.items():
        for item in items if isinstance(items, list) else [items]:
            if isinstance(item, Mapping):
                rows.append({"input": role, **item})
            elif item is not None:
                rows.append({"input": role, "source": str(item)})
    e = html.escape
    body = "".join(
        f'<tr><td class="l">{e(r["input"])}</td><td class="l"><code>{e(r["source"])}</code></td>'
        f"<td>{e(human_size(r.get('bytes')) or 'not a file')}</td>"
        f'<td class="l">{e(utc_time(r.get("modified_ms")))}</td></tr>'
        for r in rows
    )
    return (
        '<div class="scroll"><table><tr><th class="l">input</th><th class="l">read from</th>'
        f'<th>size</th><th class="l">modified</th></tr>{body}</table></div>'
    )


def render_html(summary: Mapping[str, Any]) -> str:
    e = html.escape
    c = summary["counts"]
    failed = summary["failed"]
    banner = (
        f'<p class="banner bad">Above threshold: '
        f"{e(', '.join(f'{k} = {v}' for k, v in failed.items()))}</p>"
        if failed
        else '<p class="banner good">No class above its threshold.</p>'
    )
    rows = []
    for name in BENIGN_CLASSES + DISCREPANCY_CLASSES:
        cls = "bad" if name in failed else ("good" if name in BENIGN_CLASSES else "")
        rows.append(
            f'<tr><td class="l {cls}">{e(name)}</td><td>{c[name]}</td>'
            f'<td class="l muted">{e(DESCRIPTIONS[name])}</td></tr>'
        )
    rows.append(
        f'<tr><td class="l">other</td><td>{c["other"]}</td>'
        f'<td class="l muted">{e(OTHER_DESCRIPTION)}</td></tr>'
    )
    counts = (
        "<table><tr><th class='l'>class</th><th>keys</th><th class='l'>meaning</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    subs = _table(
        summary["per_subscription"],
        ["group", "topic", "keys", "messages", "deliveries"] + DISCREPANCY_CLASSES,
    )
    days = _table(
        summary["per_day"], ["group", "topic", "day", "keys", "messages"] + DISCREPANCY_CLASSES
    )
    samples = (
        "".join(
            f"<h3>{e(name)} <span class='muted'>({c[name]}; first {len(rows_)})</span></h3>"
            + _table(rows_, SAMPLE_COLUMNS)
            for name, rows_ in summary["samples"].items()
        )
        or "<p>No discrepancies.</p>"
    )
    extra = ", ".join(f"{k}: {c[k]}" for k in ("unkeyed_messages", "out_of_scope_records") if c[k])
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>idemp reconciliation</title><style>{_CSS}</style></head><body>
<h1>idemp reconciliation</h1>
<p>{c["keys"]} business keys, {c["messages"]} messages, {c["deliveries"]} deliveries;
as of {utc_time(summary["as_of_ms"])}; key = <code>{e(summary["key_from"])}</code>.
{e(extra)}</p>
{banner}
<h2>Counts per class</h2>{counts}
<h2>Deliveries per key</h2>{_svg_histogram(summary["deliveries_histogram"])}
<h2>Per subscription</h2>{subs}
<h2>Per day</h2>{days}
<h2>Samples</h2>{samples}
<h2>Inputs</h2>{_inputs_table(summary["inputs"])}
</body></html>
"""
