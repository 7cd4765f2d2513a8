"""``idemp reconcile``: the command line of the reconciliation job.

Exit status: 0 clean, 1 a class above its threshold (cron and CI alarm on it),
2 bad input or usage (nothing presented as a complete report).
The same entry point runs under ``spark-submit`` (``python -m idemp.reconcile`` or
``spark-submit …/idemp/reconcile/__main__.py``): the master then comes from spark-submit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..urls import mask_url
from .job import DEFAULT_NAMESPACE, JobConfig, Subscription
from .loaders import (
    EffectSource,
    InputError,
    check_brokers,
    export_redis,
    export_sql_table,
    is_jdbc,
    load_all_offsets,
    load_effects,
    load_history,
    load_jdbc_records,
    load_redis_records,
    map_records,
    offsets_frame,
    read_table,
    redact,
)
from .schemas import DEFAULT_FAIL_ON, DISCREPANCY_CLASSES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--history",
        action="append",
        default=[],
        help="message history: Parquet or JSON lines (file or directory); repeatable",
    )
    p.add_argument(
        "--records",
        action="append",
        default=[],
        help="dedup records: a unique-key table export, or a Redis flag export "
        "(told apart by their columns), or the unique-key table over JDBC: "
        "jdbc:URL[#TABLE] (table default idemp_dedup; needs --jdbc-jars); "
        "repeatable",
    )
    p.add_argument(
        "--jdbc-jars",
        action="append",
        default=[],
        metavar="JAR_OR_DIR",
        help="JDBC driver jars (or a directory of them) for jdbc: records; repeatable",
    )
    p.add_argument(
        "--offsets",
        action="append",
        default=[],
        help="consumerOffset.json (RocketMQ's or idemp's broker's), or a live broker: "
        "broker://HOST:PORT?group=G&topic=T; several brokers: BROKER=PATH (repeatable), "
        "or a live cluster: namesrv://HOST:PORT?group=G&topic=T",
    )
    p.add_argument("--out", help="output directory")
    p.add_argument(
        "--effects",
        action="append",
        default=[],
        metavar="PATH:KEY_COLUMN[:NS]",
        help="a business table export whose rows are effects; repeatable",
    )
    p.add_argument(
        "--subscription",
        action="append",
        default=[],
        metavar="TOPIC@GROUP",
        help="what to reconcile (default: every topic@group in --offsets)",
    )
    p.add_argument(
        "--namespace-template",
        default=DEFAULT_NAMESPACE,
        help="how dedup records are namespaced (default: %(default)s)",
    )
    p.add_argument(
        "--key",
        default="keys",
        dest="key_from",
        help="business key: keys (first KEYS token), property:NAME, json:$.path",
    )
    p.add_argument(
        "--as-of",
        type=int,
        default=None,
        metavar="EPOCH_MS",
        help="the time CONSUMING deadlines are judged against (default: now)",
    )
    p.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="CLASS=N",
        help="exit 1 when CLASS exceeds N (default: "
        + ", ".join(f"{k}={v}" for k, v in DEFAULT_FAIL_ON.items())
        + ")",
    )
    p.add_argument(
        "--fingerprint",
        choices=["none", "sha256"],
        default="none",
        help="sha256: record fingerprints are SHA-256 of the body, compare them with the history's",
    )
    p.add_argument(
        "--redis-prefix",
        default="idemp",
        help="key prefix of the Redis strategies' records (default idemp)",
    )
    p.add_argument(
        "--redis-retention-s",
        type=float,
        default=7 * 86400.0,
        help="the Redis strategy's retention (recovers CONSUMING deadlines)",
    )
    p.add_argument("--master", default=None, help="Spark master (default local[*])")
    p.add_argument(
        "--shuffle-partitions",
        type=int,
        default=None,
        help="spark.sql.shuffle.partitions (default: twice the cores, at least 4, locally)",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark configuration; repeatable",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument(
        "--no-html", action="store_true", help="write the JSON and text report, no report.html"
    )
    sub = p.add_subparsers(dest="reconcile_command")
    t = sub.add_parser("export-table", help="a SQL table (dedup or business) to Parquet")
    t.add_argument("--url", required=True, help="SQLAlchemy URL")
    t.add_argument("--table", required=True, help="table to export")
    t.add_argument("--out", required=True, dest="export_out", help="Parquet file to write")
    r = sub.add_parser("export-redis", help="Redis flags (SCAN) to Parquet, with TTLs")
    r.add_argument("--url", required=True, help="redis:// or redis+cluster:// URL")
    r.add_argument("--match", default="idemp:*", help="SCAN pattern (default idemp:*)")
    r.add_argument("--out", required=True, dest="export_out", help="Parquet file to write")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="idemp reconcile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"{what} {item!r}: expected KEY=VALUE")
        out[k.strip()] = v.strip()
    return out


def thresholds(items: list[str]) -> dict[str, int]:
    out = dict(DEFAULT_FAIL_ON)
    for k, v in _pairs(items, "--fail-on").items():
        if k not in DISCREPANCY_CLASSES:
            raise ValueError(f"--fail-on {k}: not a class ({', '.join(DISCREPANCY_CLASSES)})")
        out[k] = int(v)
    return out


def load_records(
    spark: SparkSession, path: str, namespaces: list[str], args: argparse.Namespace
) -> DataFrame:
    """A unique-key table (exported, or over JDBC) or a Redis flag export, told
    apart by their columns."""
    if is_jdbc(path):
        return load_jdbc_records(spark, path)
    probe = read_table(spark, "records", path, [], [], allow_empty=True)
    if {"redis_key", "value", "pttl_ms"} <= set(probe.columns):
        return load_redis_records(
            spark,
            path,
            namespaces,
            prefix=args.redis_prefix,
            retention_ms=int(args.redis_retention_s * 1000),
        )
    return map_records(read_table(spark, "records", path, [], []), path)


def reconcile(args: argparse.Namespace) -> int:
    from . import report
    from .session import get_session

    missing = [f"--{n}" for n in ("history", "records", "offsets", "out") if not getattr(args, n)]
    if missing:
        print(f"idemp reconcile: missing {', '.join(missing)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    report.clear_outputs(out)
    try:
        fail_on = thresholds(args.fail_on)
        conf = _pairs(args.conf, "--conf")
        offsets = load_all_offsets(args.offsets)
        pairs = [tuple(s.rsplit("@", 1)) for s in args.subscription]
        if any(len(p) != 2 or not all(p) for p in pairs):
            raise ValueError("--subscription expects TOPIC@GROUP")
        subs = (
            [Subscription.of(g, t, args.namespace_template) for t, g in pairs]
            if pairs
            else [
                Subscription.of(g, t, args.namespace_template)
                for g, t in sorted({gt for o in offsets for gt in o.subscriptions()})
            ]
        )
        if not subs:
            raise InputError("offsets", args.offsets[0], "names no subscription (topic@group)")
        namespaces = [s.namespace for s in subs]
        effect_sources = [EffectSource.parse(e) for e in args.effects]
        for e in effect_sources:
            if e.namespace is None and len(subs) != 1:
                raise ValueError(
                    f"--effects {e.path}: name the namespace (PATH:COLUMN:NS), "
                    f"there are {len(subs)} subscriptions"
                )
            if e.namespace is not None and e.namespace not in namespaces:
                raise ValueError(
                    f"--effects {e.path}: namespace {e.namespace!r} is not one of {namespaces}"
                )
        cfg = JobConfig(
            subscriptions=subs,
            as_of_ms=args.as_of if args.as_of is not None else int(time.time() * 1000),
            key_from=args.key_from,
            fingerprint=args.fingerprint,
            effect_namespaces=frozenset(e.namespace or namespaces[0] for e in effect_sources),
        )
        spark = get_session(args.master, args.shuffle_partitions, conf, jdbc_jars=args.jdbc_jars)
        history = _union([load_history(spark, h, need=cfg.history_columns()) for h in args.history])
        check_brokers(history, offsets)
        records = _union([load_records(spark, r, namespaces, args) for r in args.records])
        effects = (
            _union([load_effects(spark, e, e.namespace or namespaces[0]) for e in effect_sources])
            if effect_sources
            else None
        )
        inputs: dict[str, Any] = {
            "history": [report.describe_input(h) for h in args.history],
            "records": [report.describe_input(r, redact(r)) for r in args.records],
            "offsets": [report.describe_input(o, redact(o)) for o in args.offsets],
            "effects": [
                report.describe_input(e.path, spec)
                for e, spec in zip(effect_sources, args.effects, strict=True)
            ],
        }
        outcome = report.run(
            spark,
            history,
            records,
            effects,
            offsets_frame(spark, offsets),
            cfg,
            out,
            fail_on=fail_on,
            inputs=inputs,
            progress=not args.no_progress,
            html_report=not args.no_html,
        )
    except (InputError, ValueError) as exc:
        report.write_error(out, exc)
        print(f"idemp reconcile: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        report.write_error(out, exc)
        raise
    print(report.format_terminal(outcome.summary, out))
    return outcome.exit_code


def _union(dfs: list[DataFrame]) -> DataFrame:
    df = dfs[0]
    for other in dfs[1:]:
        df = df.unionByName(other)
    return df


def run(args: argparse.Namespace) -> int:
    if args.reconcile_command in ("export-table", "export-redis"):
        return _export(args)
    return reconcile(args)


def _export(args: argparse.Namespace) -> int:
    """An export that cannot reach its source or write its file says so in one line
    (the URL masked), exit status 2: it is a command run by hand or by cron."""
    command = f"idemp reconcile {args.reconcile_command}"
    try:
        if args.reconcile_command == "export-table":
            n = export_sql_table(args.url, args.table, args.export_out)
            print(f"exported {n} rows of {args.table} to {args.export_out}")
        else:
            n = export_redis(args.url, args.match, args.export_out)
            print(f"exported {n} Redis keys matching {args.match!r} to {args.export_out}")
    except OSError as exc:
        print(f"{command}: cannot write {args.export_out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # driver errors: SQLAlchemy, redis-py, pyarrow
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = reason.replace(args.url, mask_url(args.url))
        print(f"{command}: {mask_url(args.url)}: {reason}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
