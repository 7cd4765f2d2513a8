"""The chaos run's second opinion: the Spark reconciliation job over what the run left.

The run's own verdict reads the business table; this one is what an operator would run
the next morning: the broker's history (exported from its store), the dedup records
(the unique-key table on PostgreSQL, the Redis flags), the effects table split per
subscription, and the broker's committed offsets, through ``idemp reconcile`` in a
child process (its own JVM, nothing left in the caller). Both verdicts must agree.

What the report is expected to show besides ``ok`` and ``duplicate_absorbed``:
``record_missing`` for keys whose dedup record cannot exist any more, namely stream
events whose Redis flag went with a Redis restart (no persistence), and every ride
transition (the state-machine guard keeps state rows, not dedup rows). Those are
counted and printed, not failures: the business table has the one effect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from chaos.app import DEDUP_TABLE, EFFECTS, REDIS_PREFIX
from chaos.scenario import (
    PAY5_GROUP,
    PAY5_TOPIC,
    PAY_GROUP,
    PAY_TOPIC,
    RIDES_GROUP,
    RIDES_TOPIC,
    SEQ_GROUP,
    SEQ_TOPIC,
)

ROOT = Path(__file__).resolve().parents[1]
RECONCILE_TIMEOUT_S = 1800.0
SUBSCRIPTIONS = (
    (PAY_TOPIC, PAY_GROUP),
    (SEQ_TOPIC, SEQ_GROUP),
    (RIDES_TOPIC, RIDES_GROUP),
    (PAY5_TOPIC, PAY5_GROUP),
)


@dataclass
class Reconciled:
    exit_code: int
    counts: dict[str, int] = field(default_factory=dict)
    report: Path | None = None
    error: str = ""

    def get(self, name: str) -> int:
        return int(self.counts.get(name, 0))


def export_inputs(
    workdir: Path, stores: dict[str | None, Path], pg_url: str, redis_url: str
) -> list[str]:
    """Write the job's inputs under ``workdir``; return its arguments for them.
    ``stores``: each broker's store by broker name (None: the one broker, not named)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from idemp.broker.export import export
    from idemp.reconcile.loaders import export_redis, export_sql_table

    inputs = workdir / "reconcile-inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    argv = ["--redis-prefix", REDIS_PREFIX]
    for name, store in stores.items():
        history = inputs / f"history-{name or 'broker'}.parquet"
        export(store, history, broker=name)
        offsets = str(store / "config" / "consumerOffset.json")
        argv += ["--history", str(history), "--offsets", f"{name}={offsets}" if name else offsets]
    # An empty export is refused by the job (an empty input is a bad input); the Redis
    # flags are empty when Redis restarted after the last stream event.
    if export_sql_table(pg_url, DEDUP_TABLE, inputs / "records.parquet"):
        argv += ["--records", str(inputs / "records.parquet")]
    if export_redis(redis_url, f"{REDIS_PREFIX}:*", inputs / "flags.parquet"):
        argv += ["--records", str(inputs / "flags.parquet")]
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            for topic, group in SUBSCRIPTIONS:
                keys = conn.execute(sa.select(EFFECTS.c.key).where(EFFECTS.c.topic == topic))
                path = inputs / f"effects-{group}.parquet"
                pq.write_table(pa.table({"key": pa.array([k for (k,) in keys], pa.string())}), path)
                argv += [
                    "--effects",
                    f"{path}:key:{group}/{topic}",
                    "--subscription",
                    f"{topic}@{group}",
                ]
    finally:
        engine.dispose()
    return argv


def reconcile(
    workdir: Path, stores: dict[str | None, Path], pg_url: str, redis_url: str
) -> Reconciled:
    """Export, then run the job; the broker must be stopped (its store is read directly)."""
    out = workdir / "reconcile-report"
    argv = [
        sys.executable,
        "-m",
        "idemp.reconcile",
        *export_inputs(workdir, stores, pg_url, redis_url),
        "--out",
        str(out),
        "--master",
        "local[2]",
        "--shuffle-partitions",
        "4",
        "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    with open(workdir / "reconcile.log", "w", encoding="utf-8") as log:
        try:
            code = subprocess.run(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
                timeout=RECONCILE_TIMEOUT_S,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            return Reconciled(-1, error=f"reconciliation exceeded {RECONCILE_TIMEOUT_S:.0f} s")
    summary = out / "summary.json"
    if not summary.exists():
        tail = (workdir / "reconcile.log").read_text(errors="replace")[-2000:]
        return Reconciled(code, error=f"no summary.json (exit {code}):\n{tail}")
    data = json.loads(summary.read_text())
    return Reconciled(
        code,
        {k: int(v) for k, v in data["counts"].items() if isinstance(v, (int, float))},
        out / "report.html",
    )
