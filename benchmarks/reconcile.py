"""``python -m benchmarks reconcile [--sizes 1M,5M,20M]``: the reconciliation job.

Generates a history with known injected faults (pyarrow/numpy, no Python loop per
row), runs the Spark job in local mode (``--master``, default local[2]) and the same
classification in plain pandas on the same files, checks both against the injected
counts, and prints wall time (session start apart), rows/s and peak memory:
the Python driver's RSS (``ru_maxrss``) and the JVM's (``VmHWM``; in local mode the
executors live in that JVM), with the JVM's CPU seconds and the load average, since
the machine is shared. Generated inputs are cached by size and generator version
(``.cache/bench-reconcile/``): the generator is deterministic, so a cached set is the
same data.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GROUP, TOPIC = "g1", "orders"
NS = f"{GROUP}/{TOPIC}"
QUEUES = 4
AS_OF = 1_700_000_000_000
T0 = AS_OF - 86_400_000
# Bumped whenever generate() changes what it writes: cached inputs of another version
# are regenerated.
GENERATOR_VERSION = 2
# Row groups like the exporters' (idemp.history.BATCH_ROWS and export_sql_table write
# 50,000-row batches): a reader can split the files across cores.
ROW_GROUP = 1 << 17
CACHE = Path(__file__).resolve().parent.parent / ".cache" / "bench-reconcile"


def _keys(ids: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise("k", pa.array(ids).cast(pa.string()), "")


def generate(n: int, out: Path) -> dict[str, int]:
    """Write history/records/effects Parquet and consumerOffset.json under ``out``;
    return the exact class counts the job must find.

    Layout: ``D = n/20`` producer duplicates (keys 0..D-1 sent twice), ``K = n - D``
    keys; the last ``P`` messages are past the committed offset (pending); disjoint key
    ranges after D carry one injected fault each; conflicts are among the duplicates.
    """
    out.mkdir(parents=True, exist_ok=True)
    d, p = n // 20, max(1, n // 1000)
    k = n - d
    sizes = {
        "lost": n // 1000,
        "doubled": n // 2000,
        "stuck": 3 * n // 10000,
        "effect_missing": n // 5000,
        "dead_lettered": 3 * n // 20000,
        "record_missing": n // 10000,
    }
    ranges: dict[str, tuple[int, int]] = {}
    start = d
    for name, size in sizes.items():
        ranges[name] = (start, start + size)
        start += size
    assert start < k - p
    n_conflict, n_orphan = n // 10000, 4 * n // 10000

    def in_range(ids: np.ndarray, name: str) -> np.ndarray:
        lo, hi = ranges[name]
        return (ids >= lo) & (ids < hi)

    # --- history: dup copies first, then every key once (the last P are pending) ---
    ids = np.concatenate([np.arange(d), np.arange(k)]).astype(np.int64)
    i = np.arange(n, dtype=np.int64)
    sha_ids = pc.binary_join_element_wise("h", pa.array(ids).cast(pa.string()), "")
    conflict = np.zeros(n, dtype=bool)
    conflict[d : d + n_conflict] = True  # the second copies of keys 0..n_conflict-1
    sha = pc.if_else(pa.array(conflict), pc.binary_join_element_wise("x", sha_ids, ""), sha_ids)
    dlq_lo, dlq_hi = ranges["dead_lettered"]
    n_dlq = dlq_hi - dlq_lo
    dlq_ids = np.arange(dlq_lo, dlq_hi, dtype=np.int64)
    all_ids = np.concatenate([ids, dlq_ids])
    m = len(all_ids)

    def two(first: str | None, second: str | None) -> pa.Array:
        """n copies of ``first``, then n_dlq of ``second`` (no Python list per row)."""
        return pa.concat_arrays(
            [
                pa.repeat(pa.scalar(first, pa.string()), n),
                pa.repeat(pa.scalar(second, pa.string()), n_dlq),
            ]
        )

    history = pa.table(
        {
            "topic": two(TOPIC, f"%DLQ%{GROUP}"),
            "queue_id": pa.array(
                np.concatenate([i % QUEUES, np.zeros(n_dlq, np.int64)]), pa.int32()
            ),
            "queue_offset": pa.array(np.concatenate([i // QUEUES, np.arange(n_dlq)]), pa.int64()),
            "msg_id": pc.binary_join_element_wise(
                "M", pa.array(np.arange(m)).cast(pa.string()), ""
            ),
            "keys": _keys(all_ids),
            "body_sha256": pa.concat_arrays([sha, _keys(dlq_ids)]),
            "store_timestamp": pa.array(T0 + np.arange(m) * 10, pa.int64()),
            "reconsume_times": pa.array(np.zeros(m, np.int32), pa.int32()),
            "kind": two("message", "dlq"),
            "visible": pa.array(np.ones(m, dtype=bool)),
            "retry_topic": two(None, TOPIC),
            "real_topic": pa.nulls(m, pa.string()),
        }
    )
    pq.write_table(history, out / "history.parquet", row_group_size=ROW_GROUP)
    del history

    # --- records ---
    keys = np.arange(k, dtype=np.int64)
    no_record = (
        in_range(keys, "lost")
        | in_range(keys, "dead_lettered")
        | in_range(keys, "record_missing")
        | (keys >= k - p)
    )
    rec_ids = np.concatenate([keys[~no_record], np.arange(k, k + n_orphan)])
    stuck = (rec_ids >= ranges["stuck"][0]) & (rec_ids < ranges["stuck"][1])
    r = len(rec_ids)
    records = pa.table(
        {
            "namespace": pa.repeat(pa.scalar(NS, pa.string()), r),
            "business_key": _keys(rec_ids),
            "status": pc.if_else(pa.array(stuck), "CONSUMING", "CONSUMED"),
            "deadline_ms": pa.array(np.where(stuck, AS_OF - 60_000, AS_OF - 3_600_000), pa.int64()),
            "expires_ms": pa.array(np.full(r, AS_OF + 86_400_000), pa.int64()),
            "fingerprint": pa.nulls(r, pa.string()),
            "attempts": pa.array(np.ones(r, np.int32), pa.int32()),
            "owner": pa.repeat(pa.scalar("c1", pa.string()), r),
            "updated_ms": pa.array(np.full(r, AS_OF - 1000), pa.int64()),
        }
    )
    pq.write_table(records, out / "records.parquet", row_group_size=ROW_GROUP)
    del records

    # --- effects: one row per applied key; two for the doubled ---
    no_effect = (
        in_range(keys, "lost")
        | in_range(keys, "effect_missing")
        | in_range(keys, "dead_lettered")
        | (keys >= k - p)
    )
    eff_ids = np.concatenate([keys[~no_effect], np.arange(*ranges["doubled"])])
    pq.write_table(
        pa.table({"order_id": _keys(eff_ids), "points": pa.array(np.ones(len(eff_ids), np.int32))}),
        out / "effects.parquet",
        row_group_size=ROW_GROUP,
    )
    committed = {str(q): (n - p - q + QUEUES - 1) // QUEUES for q in range(QUEUES)}
    (out / "consumerOffset.json").write_text(
        json.dumps({"offsetTable": {f"{TOPIC}@{GROUP}": committed}})
    )
    faults = sum(sizes.values())
    return {
        "keys": k + n_orphan,
        "messages": n,
        # single-copy keys with no injected fault and already acknowledged
        "ok": (k - d) - faults - p,
        "duplicate_absorbed": d,
        "conflict": n_conflict,
        "orphan": n_orphan,
        "pending": p,
        **sizes,
    }


# ---------------------------------------------------------------------------------------
# the same classification in plain pandas (one machine, everything in memory)
# ---------------------------------------------------------------------------------------


def pandas_reconcile(d: Path, as_of: int = AS_OF) -> dict[str, int]:
    """The job's rules for one subscription (messages, %DLQ% copies, offsets,
    records, effects) in pandas; returns the class counts."""
    import pandas as pd

    cols = [
        "topic",
        "queue_id",
        "queue_offset",
        "keys",
        "body_sha256",
        "kind",
        "visible",
        "retry_topic",
    ]
    h = pd.read_parquet(d / "history.parquet", columns=cols)
    offsets = json.loads((d / "consumerOffset.json").read_text())["offsetTable"]
    committed = offsets.get(f"{TOPIC}@{GROUP}", {})
    h = h[
        (h.visible)
        & (
            ((h.kind == "message") & (h.topic == TOPIC))
            | ((h.kind == "dlq") & (h.topic == f"%DLQ%{GROUP}") & (h.retry_topic == TOPIC))
        )
    ]
    h["key"] = h["keys"].str.split(" ", n=1).str[0]
    is_msg = h.kind == "message"
    limit = h.queue_id.astype(str).map(committed).fillna(-1)
    h["msg"] = is_msg
    h["dlq"] = h.kind == "dlq"
    h["committed"] = is_msg & (h.queue_offset < limit)
    h["uncommitted"] = is_msg & ~h["committed"]
    g = h.groupby("key", sort=False).agg(
        n_messages=("msg", "sum"),
        n_dlq=("dlq", "sum"),
        n_uncommitted=("uncommitted", "sum"),
    )
    codes = pd.Series(pd.factorize(h.body_sha256)[0], index=h.index)  # ints: fast min/max
    sha = codes[is_msg].groupby(h.key[is_msg], sort=False).agg(["min", "max"])
    g = g.join((sha["min"] != sha["max"]).rename("conflict"))
    r = pd.read_parquet(
        d / "records.parquet", columns=["namespace", "business_key", "status", "deadline_ms"]
    )
    r = r[r.namespace == NS].drop(columns="namespace").set_index("business_key")
    e = pd.read_parquet(d / "effects.parquet", columns=["order_id"])
    ne = e.groupby("order_id").size().rename("n_effects")
    df = g.join(r, how="outer").join(ne, how="left")
    df["n_effects"] = df.n_effects.fillna(0)
    for c in ("n_messages", "n_dlq", "n_uncommitted"):
        df[c] = df[c].fillna(0)
    has = (df.n_messages + df.n_dlq) > 0
    consumed = df.status == "CONSUMED"
    consuming = df.status == "CONSUMING"
    stuck = consuming & (df.deadline_ms < as_of)
    fresh = consuming & ~stuck
    dead = df.n_dlq > 0
    outstanding = df.n_uncommitted > 0
    eff = df.n_effects
    once = consumed & (eff == 1)
    flags = {
        "doubled": eff > 1,
        "lost": has & ~outstanding & ~dead & ~consumed & ~fresh & (eff == 0),
        "effect_missing": has & consumed & (eff == 0),
        "stuck": stuck,
        "conflict": df.conflict.astype("boolean").fillna(False).astype(bool),
        "dead_lettered": dead,
        "record_missing": has & (eff > 0) & df.status.isna(),
        "orphan": ~has & df.status.notna(),
        "pending": outstanding & ~consumed & (eff == 0),
        "duplicate_absorbed": (df.n_messages > 1) & once,
        "ok": (df.n_messages == 1) & once,
    }
    counts = {k: int(v.sum()) for k, v in flags.items()}
    counts["keys"] = len(df)
    counts["messages"] = int(df.n_messages.sum())
    return counts


# ---------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------


def _vm_hwm_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process: comparable across runs on a shared
    machine, where wall time depends on what the others run."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _jvm_pid(spark: Any) -> int:
    """The local JVM: the java child process of this Python (launched by py4j)."""
    me = str(os.getpid())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if ppid == me and b"java" in cmd.split(b"\0", 1)[0]:
            return int(proc.name)
    return -1


def _size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def inputs(n: int, base: Path) -> tuple[Path, dict[str, int]]:
    """The generated inputs for ``n`` messages, from the cache when present
    (``expected.json`` is written last: a directory without it is regenerated)."""
    d = base / f"n{n}-v{GENERATOR_VERSION}"
    if not (d / "expected.json").exists():
        shutil.rmtree(d, ignore_errors=True)
        t = time.monotonic()
        # in a child: the generator's peak memory must not count as the driver's
        import subprocess
        import sys

        root = Path(__file__).resolve().parent.parent
        code = (
            "import json,sys;from pathlib import Path;"
            "from benchmarks.reconcile import generate;d=Path(sys.argv[2]);"
            "e=generate(int(sys.argv[1]),d);(d/'expected.json').write_text(json.dumps(e))"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(n), str(d)],
            check=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        print(f"generated {n:,} messages in {time.monotonic() - t:.1f} s ({d})")
    return d, json.loads((d / "expected.json").read_text())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks reconcile")
    ap.add_argument("--sizes", default="1M,5M,20M", help="comma-separated, e.g. 1M,5M")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--shuffle-partitions", type=int, default=8)
    ap.add_argument("--driver-memory", default="4g")
    ap.add_argument(
        "--dir", default=str(CACHE), help="where generated inputs are cached (default: %(default)s)"
    )
    ap.add_argument("--no-pandas", action="store_true")
    ap.add_argument(
        "--pandas-max-mb",
        type=int,
        default=12_000,
        help="stop the pandas run when its RSS exceeds this (the machine is "
        "shared; default %(default)s)",
    )
    ap.add_argument("--json", default=None, help="append results as JSON lines here")
    args = ap.parse_args(argv)
    sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
    base = Path(args.dir)

    from idemp.reconcile import report
    from idemp.reconcile.job import JobConfig, Subscription
    from idemp.reconcile.loaders import (
        EffectSource,
        load_effects,
        load_history,
        load_offsets,
        load_sql_records,
    )
    from idemp.reconcile.session import get_session

    datasets = {n: inputs(n, base) for n in sizes}  # before the JVM: its memory is free
    print(f"load average before the session: {_load()}")
    t = time.monotonic()
    spark = get_session(
        args.master, args.shuffle_partitions, {"spark.driver.memory": args.driver_memory}
    )
    session_s = time.monotonic() - t
    print(
        f"session start: {session_s:.1f} s ({args.master}, "
        f"{args.shuffle_partitions} shuffle partitions)"
    )
    jvm = _jvm_pid(spark)
    failed = False
    print(
        f"{'messages':>10} {'spark s':>8} {'rows/s':>10} {'JVM cpu s':>9} {'driver MB':>9}"
        f" {'JVM MB':>7} {'pandas s':>8} {'pandas rows/s':>13} {'pandas MB':>9}  counts"
        f"  load avg (1/5/15 min)"
    )
    try:
        for n in sizes:
            d, expected = datasets[n]
            load_before = _load()
            cpu0 = _cpu_s(jvm)
            t = time.monotonic()
            cfg = JobConfig(
                [Subscription.of(GROUP, TOPIC)], AS_OF, effect_namespaces=frozenset([NS])
            )
            offsets = load_offsets(d / "consumerOffset.json")
            outcome = report.run(
                spark,
                load_history(spark, d / "history.parquet"),
                load_sql_records(spark, d / "records.parquet"),
                load_effects(spark, EffectSource(str(d / "effects.parquet"), "order_id"), NS),
                offsets.to_spark(spark),
                cfg,
                d / "out",
                progress=False,
            )
            spark_s = time.monotonic() - t
            got = outcome.summary["counts"]
            ok = all(got[k] == v for k, v in expected.items())
            driver_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            row: dict[str, Any] = {
                "messages": n,
                "session_s": round(session_s, 1),
                "spark_s": round(spark_s, 2),
                "spark_rows_s": int(n / spark_s),
                "jvm_cpu_s": round(_cpu_s(jvm) - cpu0, 1),
                "driver_rss_mb": round(driver_mb),
                "jvm_hwm_mb": round(_vm_hwm_mb(jvm)) if jvm > 0 else None,
                "spark_counts_exact": ok,
                "load_before": load_before,
                "load_after": _load(),
            }
            if not args.no_pandas:
                pd_row = _pandas_child(d, args.pandas_max_mb)
                row.update(pd_row)
                ok = ok and pd_row["pandas_counts_exact"] is not False
            failed = failed or not ok
            if args.json:  # first: a figure is never lost to a printing problem
                with open(args.json, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
            cell = functools.partial(_cell, row)
            print(
                f"{n:>10} {cell('spark_s'):>8} {cell('spark_rows_s'):>10} "
                f"{cell('jvm_cpu_s'):>9} {cell('driver_rss_mb'):>9} {cell('jvm_hwm_mb'):>7} "
                f"{cell('pandas_s'):>8} {cell('pandas_rows_s'):>13} "
                f"{cell('pandas_rss_mb'):>9}  {'exact' if ok else 'WRONG'}"
                f"  {load_before} -> {row['load_after']}",
                flush=True,
            )
            if row.get("pandas_error"):
                print(f"  pandas: {row['pandas_error']}")
            if not ok:
                print("  expected", expected, "\n  got     ", {k: got[k] for k in expected})
    finally:
        spark.stop()
    return 1 if failed else 0


def _cell(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    return "-" if value is None else str(value)


def _pandas_child(d: Path, max_mb: int) -> dict[str, Any]:
    """pandas in a fresh process, so its peak RSS is its own; stopped (and reported as
    such) when its RSS passes ``max_mb``."""
    import subprocess
    import sys

    code = (
        "import json,resource,sys,time;from pathlib import Path;"
        "from benchmarks.reconcile import pandas_reconcile;"
        "t=time.monotonic();c=pandas_reconcile(Path(sys.argv[1]));s=time.monotonic()-t;"
        "print(json.dumps({'s':s,'c':c,"
        "'mb':resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024}))"
    )
    root = Path(__file__).resolve().parent.parent
    expected = json.loads((d / "expected.json").read_text())
    n = expected["messages"]
    t = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(d)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, _rss_mb(proc.pid))
        if peak > max_mb:
            proc.kill()
            proc.communicate()
            return {
                "pandas_s": None,
                "pandas_rows_s": None,
                "pandas_rss_mb": round(peak),
                "pandas_counts_exact": None,
                "pandas_error": f"stopped after {time.monotonic() - t:.0f} s: RSS passed "
                f"{max_mb} MB",
            }
        time.sleep(0.2)  # polling the child's RSS; the run itself takes seconds
    out, err = proc.communicate()
    if proc.returncode != 0:
        return {
            "pandas_s": None,
            "pandas_rows_s": None,
            "pandas_rss_mb": round(peak),
            "pandas_counts_exact": None,
            "pandas_error": f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}",
        }
    data = json.loads(out.strip().splitlines()[-1])
    return {
        "pandas_s": round(data["s"], 2),
        "pandas_rows_s": int(n / data["s"]),
        "pandas_rss_mb": round(data["mb"]),
        "pandas_counts_exact": all(data["c"].get(k, v) == v for k, v in expected.items()),
    }


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
