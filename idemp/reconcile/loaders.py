"""One loader per source; each validates its columns and maps them onto ``schemas``.

Every failure to read or validate an input raises :class:`InputError` naming the
file and, where it applies, the column, so an operator can fix the input rather
than read a JVM stack trace. Nothing here collects rows to the driver except the
offsets file (one number per queue) and ``head(1)`` emptiness checks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from idemp.remoting import jsonlenient

from .schemas import (
    EFFECT_FIELDS,
    HISTORY_OPTIONAL,
    HISTORY_REQUIRED,
    OFFSET_FIELDS,
    RECORD_FIELDS,
    ddl,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
CORRUPT = "_corrupt_record"


class InputError(ValueError):
    """An input cannot be used: says which file and, if known, which column."""

    def __init__(self, what: str, path: str | Path, problem: str, column: str | None = None):
        self.what, self.path, self.column, self.problem = what, str(path), column, problem
        where = f"{what} input {path}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {problem}")


# ---------------------------------------------------------------------------------------
# generic reading and type checks
# ---------------------------------------------------------------------------------------

_INTEGRAL = {"tinyint", "smallint", "int", "bigint", "byte", "short", "integer", "long"}
_FAMILY = {
    "string": {"string"},
    "int": _INTEGRAL,
    "bigint": _INTEGRAL,
    "boolean": {"boolean"},
}


def input_format(path: str | Path, fmt: str | None = None) -> str:
    """``parquet`` or ``json`` (JSON lines): explicit, else from the file name; a
    directory is Parquet unless every file in it is JSON lines."""
    if fmt:
        return {"jsonl": "json", "ndjson": "json"}.get(fmt, fmt)
    p = Path(path)
    if p.suffix.lower() in JSON_SUFFIXES:
        return "json"
    if p.is_dir():
        files = [f for f in p.iterdir() if f.is_file() and not f.name.startswith((".", "_"))]
        if files and all(f.suffix.lower() in JSON_SUFFIXES for f in files):
            return "json"
    return "parquet"


def _exists(what: str, path: str | Path) -> None:
    p = Path(path)
    if "://" in str(path):  # hdfs://, s3a://: let Spark judge
        return
    if not p.exists():
        raise InputError(what, path, "does not exist")
    if p.is_file():
        try:
            with open(p, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            raise InputError(what, path, f"cannot be read: {exc.strerror or exc}") from exc


def _spark_error(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else type(exc).__name__


def read_table(
    spark: SparkSession,
    what: str,
    path: str | Path,
    required: Sequence[tuple[str, str]],
    optional: Sequence[tuple[str, str]] = (),
    fmt: str | None = None,
    allow_empty: bool = False,
) -> DataFrame:
    """Read ``path`` and return it with the required (and present optional) columns
    cast to their canonical types; raise :class:`InputError` on any problem."""
    from pyspark.sql import functions as F

    _exists(what, path)
    kind = input_format(path, fmt)
    try:
        if kind == "json" and not required and not optional:
            # a table whose columns the caller maps itself: infer (one pass)
            _first_json_record(what, path)
            df = spark.read.option("columnNameOfCorruptRecord", CORRUPT).json(str(path))
        elif kind == "json":
            df = _read_json(spark, what, path, required, optional)
        elif kind == "parquet":
            df = spark.read.parquet(str(path))
        else:
            raise InputError(what, path, f"unknown format {kind!r} (parquet or jsonl)")
    except InputError:
        raise
    except Exception as exc:  # AnalysisException, Py4JJavaError, ...
        raise InputError(what, path, f"cannot be read as {kind}: {_spark_error(exc)}") from exc
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    if not required and not optional:
        if CORRUPT in types:
            return _check_corrupt(what, path, df)
        if not allow_empty and not types:
            raise InputError(what, path, "is empty (no rows)")
        if not allow_empty and len(df.head(1)) == 0:
            raise InputError(what, path, "is empty (no rows)")
        return df
    cols: list[Column] = []
    for name, typ in list(required) + list(optional):
        if name not in types:
            if (name, typ) in optional:
                continue
            raise InputError(what, path, f"missing (has: {', '.join(sorted(types))})", name)
        have = types[name]
        if have != "void" and have not in _FAMILY.get(typ, {typ}):
            raise InputError(what, path, f"has type {have}, expected {typ}", name)
        cols.append(F.col(f"`{name}`").cast(typ).alias(name))
    if kind == "json":
        cols.append(F.col(CORRUPT))
    out = df.select(*cols)
    if not allow_empty:
        try:
            empty = len(out.head(1)) == 0
        except Exception as exc:
            raise InputError(what, path, f"cannot be read: {_spark_error(exc)}") from exc
        if empty:
            raise InputError(what, path, "is empty (no rows)")
    if kind == "json":
        out = _check_corrupt(what, path, out)
    return out


def _read_json(
    spark: SparkSession,
    what: str,
    path: str | Path,
    required: Sequence[tuple[str, str]],
    optional: Sequence[tuple[str, str]],
) -> DataFrame:
    """JSON lines with an explicit schema (no inference pass over the data).

    A column absent from every row would read as all-null, so the columns are checked
    against the first record; a value of the wrong type anywhere makes the record
    corrupt, which :func:`_check_corrupt` turns into an error naming the column.
    """
    first = _first_json_record(what, path)
    if first is not None:
        for name, _typ in required:
            if name not in first:
                raise InputError(what, path, "missing from the first record", name)
    present = [(n, t) for n, t in optional if first is None or n in first]
    schema = ddl(list(required) + present + [(CORRUPT, "string")])
    return (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT)
        .json(str(path))
    )


def _first_json_record(what: str, path: str | Path) -> dict[str, Any] | None:
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
    for f in files:
        if f.name.startswith((".", "_")):
            continue
        try:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        try:
                            rec = json.loads(line)
                        except ValueError as exc:
                            raise InputError(what, f, f"not JSON lines: {exc}") from exc
                        if not isinstance(rec, dict):
                            raise InputError(what, f, "not JSON lines of objects")
                        return rec
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(what, f, f"cannot be read: {exc}") from exc
    return None


def _check_corrupt(what: str, path: str | Path, df: DataFrame) -> DataFrame:
    """Fail on the first JSON record Spark could not parse against the schema.

    One pass over the JSON input; Parquet inputs carry their types and skip it.
    """
    from pyspark.sql import functions as F

    df = df.cache()
    bad = df.filter(F.col(CORRUPT).isNotNull()).select(CORRUPT).head(1)
    if bad:
        df.unpersist()
        raw = bad[0][0]
        column = None
        try:
            rec = json.loads(raw)
            column = next(
                (n for n, v in rec.items() if _json_type_mismatch(df, n, v)),
                None,
            )
        except ValueError:
            pass
        problem = f"a record has a value of the wrong type or is not JSON: {raw[:200]!r}"
        raise InputError(what, path, problem, column)
    return df.drop(CORRUPT)


def _json_type_mismatch(df: DataFrame, name: str, value: Any) -> bool:
    if name not in df.columns or value is None:
        return False
    typ = dict(df.dtypes)[name]
    if typ == "string":
        return not isinstance(value, str)
    if typ in ("int", "bigint"):
        return isinstance(value, bool) or not isinstance(value, int)
    if typ == "boolean":
        return not isinstance(value, bool)
    return False


# ---------------------------------------------------------------------------------------
# message history
# ---------------------------------------------------------------------------------------


def load_history(
    spark: SparkSession, path: str | Path, fmt: str | None = None, need: Iterable[str] = ()
) -> DataFrame:
    """The broker's export (``idemp broker export``) or a pulled history.

    ``need`` names optional columns the configuration requires (``properties`` for a
    key taken from a property, ``body`` for a key taken from the JSON body).
    """
    need = set(need)
    required = list(HISTORY_REQUIRED) + [(n, t) for n, t in HISTORY_OPTIONAL if n in need]
    optional = [(n, t) for n, t in HISTORY_OPTIONAL if n not in need]
    df = read_table(spark, "history", path, required, optional, fmt)
    from pyspark.sql import functions as F

    if "visible" not in df.columns:
        df = df.withColumn("visible", F.lit(True))
    if "broker" not in df.columns:  # an export of one broker's store, not named
        df = df.withColumn("broker", F.lit(None).cast("string"))
    return df


# ---------------------------------------------------------------------------------------
# dedup records
# ---------------------------------------------------------------------------------------

# Candidate source column names for each canonical field, first present wins: the
# unique-key table's own names, then names a hand-made export might use.
SQL_RECORD_COLUMNS: dict[str, tuple[str, ...]] = {
    # idemp.strategies.unique_key.make_table's names first
    "namespace": ("namespace", "ns"),
    "key": ("business_key", "key", "dedup_key"),
    "status": ("status", "state"),
    "deadline_ms": ("deadline_ms", "deadline", "deadline_at", "lease_until"),
    "expires_ms": ("expires_ms", "expiry", "expires_at", "expire_at"),
    "fingerprint": ("fingerprint", "payload_fingerprint", "digest"),
    "attempts": ("attempts", "attempt", "tries"),
    "owner": ("owner", "owner_id", "consumer"),
    "updated_ms": ("updated_ms", "updated_at", "updated", "modified_at", "created_ms"),
}
_REQUIRED_RECORD = ("namespace", "key", "status")
_TIME_FIELDS = {"deadline_ms", "expires_ms", "updated_ms"}


def epoch_ms(c: Column, typ: str) -> Column:
    """Epoch milliseconds from a timestamp, epoch seconds or epoch milliseconds.

    Numbers below 1e11 are seconds (1e11 s is the year 5138; 1e11 ms is 1973).
    """
    from pyspark.sql import functions as F

    if typ.startswith("timestamp"):
        return F.unix_millis(c)
    if typ == "date":
        return F.unix_millis(c.cast("timestamp"))
    if typ == "string":
        num = c.cast("double")
        ts = F.unix_millis(F.to_timestamp(c))
        return F.when(num.isNotNull(), epoch_ms(num, "double")).otherwise(ts)
    num = c.cast("double")
    return F.when(F.abs(num) < 1e11, num * 1000).otherwise(num).cast("bigint")


def load_sql_records(
    spark: SparkSession,
    path: str | Path,
    fmt: str | None = None,
    columns: dict[str, str] | None = None,
) -> DataFrame:
    """The unique-key table exported to Parquet/JSON lines (:func:`export_sql_table`),
    mapped onto :data:`schemas.RECORD_FIELDS`; ``columns`` overrides the source column
    of canonical fields (``{"deadline_ms": "lease_end"}``). Over JDBC:
    :func:`load_jdbc_records`."""
    return map_records(read_table(spark, "records", path, [], [], fmt), str(path), columns)


def map_records(df: DataFrame, where: str, columns: dict[str, str] | None = None) -> DataFrame:
    """The one place that maps a SQL dedup table onto the canonical record."""
    from pyspark.sql import functions as F

    types = dict(df.dtypes)
    out: list[Column] = []
    for name, typ in RECORD_FIELDS:
        candidates = (columns[name],) if columns and name in columns else SQL_RECORD_COLUMNS[name]
        src = next((c for c in candidates if c in types), None)
        if src is None:
            if name in _REQUIRED_RECORD:
                raise InputError(
                    "records", where, f"missing (has: {', '.join(sorted(types))})", candidates[0]
                )
            out.append(F.lit(None).cast(typ).alias(name))
            continue
        c = F.col(f"`{src}`")
        if name in _TIME_FIELDS:
            if (
                types[src] not in ("timestamp", "timestamp_ntz", "date", "string")
                and types[src] not in _INTEGRAL | {"double", "float"}
                and not types[src].startswith("decimal")
            ):
                raise InputError("records", where, f"has type {types[src]}, expected a time", src)
            out.append(epoch_ms(c, types[src]).alias(name))
        elif typ == "string":
            if types[src] not in ("string", "binary") and name != "key":
                raise InputError("records", where, f"has type {types[src]}, expected string", src)
            if name == "status":
                out.append(F.upper(F.trim(c.cast("string"))).alias(name))
            else:
                out.append(c.cast("string").alias(name))
        else:
            out.append(c.cast(typ).alias(name))
    return df.select(*out)


def load_redis_records(
    spark: SparkSession,
    path: str | Path,
    namespaces: Sequence[str],
    prefix: str = "idemp",
    retention_ms: int = 7 * 86400 * 1000,
    fmt: str | None = None,
) -> DataFrame:
    """Redis flags exported by :func:`export_redis` (``redis_key``, ``value``,
    ``pttl_ms``, ``exported_ms``), mapped onto the canonical record.

    The one place that knows ``idemp.strategies.redis_flag``'s layout: the key is
    ``<prefix>:{<namespace>:<key>}``, the value ``C|owner|fingerprint|attempts``
    (CONSUMING) or ``D|…`` (CONSUMED); a CONSUMING record lives deadline + retention,
    so its deadline is ``expires - retention``. Namespaces may contain ':', so a key is
    split by matching the known namespaces (longest first); a key matching none keeps
    its whole Redis name and a null namespace (counted as out of scope).
    """
    from pyspark.sql import functions as F

    required = [("redis_key", "string"), ("value", "string"), ("pttl_ms", "bigint")]
    df = read_table(spark, "records", path, required, [("exported_ms", "bigint")], fmt)
    if "exported_ms" not in df.columns:
        df = df.withColumn("exported_ms", F.lit(int(time.time() * 1000)))
    rk = F.col("redis_key")
    ns_col: Column = F.lit(None).cast("string")
    key_col: Column = rk
    for ns in sorted(namespaces, key=len, reverse=True):
        head = f"{prefix}:{{{ns}:"
        hit = rk.startswith(head) & rk.endswith("}")
        n = len(head) + 1
        inner = F.expr(f"substring(redis_key, {n}, length(redis_key) - {n})")
        ns_col = F.when(hit, F.lit(ns)).otherwise(ns_col)
        key_col = F.when(hit, inner).otherwise(key_col)
    parts = F.split(F.col("value"), "[|]")
    flag = parts.getItem(0)
    status = (
        F.when(flag == "C", F.lit("CONSUMING"))
        .when(flag == "D", F.lit("CONSUMED"))
        .otherwise(F.upper(F.col("value")))
    )
    expires = F.when(F.col("pttl_ms") >= 0, F.col("exported_ms") + F.col("pttl_ms")).cast("bigint")
    return df.select(
        ns_col.alias("namespace"),
        key_col.alias("key"),
        status.alias("status"),
        F.when(flag == "C", expires - F.lit(retention_ms)).alias("deadline_ms"),
        expires.alias("expires_ms"),
        F.when(F.length(parts.getItem(2)) > 0, parts.getItem(2)).alias("fingerprint"),
        parts.getItem(3).cast("int").alias("attempts"),
        parts.getItem(1).alias("owner"),
        F.col("exported_ms").alias("updated_ms"),
    )


# ---------------------------------------------------------------------------------------
# business effects
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EffectSource:
    """A business table (exported to Parquet/JSON lines) whose rows are effects: the
    column ``key_column`` holds the business key; the rows belong to ``namespace``."""

    path: str
    key_column: str
    namespace: str | None = None
    fmt: str | None = None

    @classmethod
    def parse(cls, spec: str) -> EffectSource:
        """``PATH:KEY_COLUMN[:NAMESPACE]`` (the namespace may itself contain ':')."""
        parts = spec.split(":", 2)
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise ValueError(f"--effects {spec!r}: expected PATH:KEY_COLUMN[:NAMESPACE]")
        return cls(parts[0], parts[1], parts[2] if len(parts) == 3 else None)


def load_effects(spark: SparkSession, src: EffectSource, namespace: str) -> DataFrame:
    from pyspark.sql import functions as F

    df = read_table(spark, "effects", src.path, [], [], src.fmt)
    if src.key_column not in df.columns:
        raise InputError(
            "effects", src.path, f"missing (has: {', '.join(sorted(df.columns))})", src.key_column
        )
    typ = dict(df.dtypes)[src.key_column]
    if typ.startswith(("array", "map", "struct", "binary")):
        raise InputError("effects", src.path, f"has type {typ}, expected a key", src.key_column)
    names = [n for n, _ in EFFECT_FIELDS]
    return df.select(
        F.lit(namespace).alias(names[0]), F.col(f"`{src.key_column}`").cast("string").alias("key")
    )


# ---------------------------------------------------------------------------------------
# consumer offsets
# ---------------------------------------------------------------------------------------


@dataclass
class Offsets:
    """Committed offsets of one broker: (topic, group, queue_id) -> next offset to
    consume. ``broker``: that broker's name, where the history comes from several."""

    table: dict[tuple[str, str, int], int] = field(default_factory=dict)
    source: str = ""
    broker: str | None = None

    def subscriptions(self) -> list[tuple[str, str]]:
        """(group, topic) pairs with stored offsets, ``%RETRY%`` topics left out."""
        return sorted({(g, t) for t, g, _ in self.table if not t.startswith("%RETRY%")})

    def rows(self) -> list[tuple[str, str, int, int]]:
        return [(t, g, q, o) for (t, g, q), o in sorted(self.table.items())]

    def to_spark(self, spark: SparkSession) -> DataFrame:
        return offsets_frame(spark, [self])


def offsets_frame(spark: SparkSession, offsets: list[Offsets]) -> DataFrame:
    rows = [(*row, o.broker) for o in offsets for row in o.rows()]
    return spark.createDataFrame(rows, schema=ddl(OFFSET_FIELDS))


def check_brokers(history: DataFrame, offsets: list[Offsets]) -> None:
    """A queue is a broker's: refuse the inputs where a record's committed offset would
    be read from another broker's queue of the same id."""
    found = [r[0] for r in history.select("broker").distinct().collect()]
    named = sorted(n for n in found if n is not None)
    offset_names = sorted(o.broker for o in offsets if o.broker is not None)
    if len(named) > 1 and not offset_names:
        raise InputError(
            "offsets",
            offsets[0].source,
            f"is one broker's, and the history holds records of brokers {', '.join(named)}: "
            "give each broker's offsets (--offsets BROKER=PATH, repeated) or the cluster's "
            "(namesrv://HOST:PORT?group=G&topic=T)",
        )
    if None in found and len(offset_names) > 1:  # found: the distinct values, null too
        raise InputError(
            "history",
            "--history",
            f"has records without a broker name, and the offsets are of brokers "
            f"{', '.join(offset_names)}: export each store with --broker-name (or pull "
            "the history with idemp history pull, which names them)",
        )


def load_all_offsets(specs: list[str]) -> list[Offsets]:
    """Every ``--offsets``: a file or a live broker (``NAME=`` before either says which
    broker its queues are on), or a live cluster, ``namesrv://HOST:PORT?group=G&topic=T``
    (each broker of the topics' routes, named). Two unnamed sources are ambiguous: their
    queue ids would collide."""
    out: list[Offsets] = []
    for spec in specs:
        if spec.startswith(NAMESRV_SCHEME):
            out += load_cluster_offsets(spec)
            continue
        name, sep, rest = spec.partition("=")
        named = sep and name and "/" not in name and ":" not in name
        loaded = load_offsets(rest if named else spec)
        if named:
            loaded.broker = name
        out.append(loaded)
    unnamed = [o.source for o in out if o.broker is None]
    if len(out) > 1 and unnamed:
        raise InputError(
            "offsets",
            unnamed[0],
            "is one of several; name each broker's offsets: --offsets BROKER=PATH",
        )
    names = [o.broker for o in out if o.broker is not None]
    if len(names) != len(set(names)):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError("offsets", dup, "broker named twice in --offsets")
    return out


def load_offsets(path: str | Path) -> Offsets:
    """``consumerOffset.json`` as RocketMQ (fastjson: bare integer keys) and idemp's
    broker write it: ``{"offsetTable": {"topic@group": {"queueId": offset}}}``; or a
    live broker, ``broker://HOST:PORT?group=G&topic=T`` (see ``load_broker_offsets``)."""
    if str(path).startswith(BROKER_SCHEME):
        return load_broker_offsets(str(path))
    _exists("offsets", path)
    try:
        data = jsonlenient.loads(Path(path).read_bytes())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InputError("offsets", path, f"not a consumerOffset.json: {exc}") from exc
    table = data.get("offsetTable") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise InputError("offsets", path, "missing", "offsetTable")
    out = Offsets(source=str(path))
    for tg, queues in table.items():
        topic, at, group = str(tg).rpartition("@")
        if not at or not topic or not group:
            raise InputError("offsets", path, f"entry {tg!r} is not 'topic@group'", "offsetTable")
        if not isinstance(queues, dict):
            raise InputError("offsets", path, f"entry {tg!r} is not a map of queues", tg)
        for qid, off in queues.items():
            try:
                out.table[(topic, group, int(qid))] = int(off)
            except (TypeError, ValueError) as exc:
                raise InputError(
                    "offsets", path, f"queue {qid!r} has offset {off!r}, expected integers", tg
                ) from exc
    if not out.table:
        raise InputError("offsets", path, "is empty (no offsets)", "offsetTable")
    return out


BROKER_SCHEME = "broker://"
NAMESRV_SCHEME = "namesrv://"


def load_broker_offsets(url: str, timeout: float = 10.0) -> Offsets:
    """Committed offsets read live with QUERY_CONSUMER_OFFSET (code 14), the request
    consumers make, so nothing is written to the broker:
    ``broker://HOST:PORT?group=G&topic=T[&queues=0,1,...]`` (``group`` and ``topic``
    repeatable). Every (group, topic) pair is asked, plus each group's
    ``%RETRY%<group>``; the queues are the topic's read queues in the broker's topic
    config (GET_ALL_TOPIC_CONFIG), or ``queues=`` for the named topics. A queue the broker answers
    QUERY_NOT_FOUND for has no committed offset and is left out, as in a file."""
    import asyncio

    addr, groups, topics, query = _offsets_url(url, BROKER_SCHEME)
    try:
        queues = [int(q) for v in query.get("queues", []) for q in v.split(",") if q]
    except ValueError as exc:
        raise InputError("offsets", url, f"queues: {exc}") from exc
    try:
        out = asyncio.run(_query_broker_offsets(addr, groups, topics, queues, timeout))
    except Exception as exc:  # the client's RemotingError, OSError, a bad answer
        raise InputError("offsets", url, f"cannot read offsets: {exc}") from exc
    out.source = url
    if not out.table:
        raise InputError("offsets", url, "the broker has no offsets for these groups and topics")
    return out


def _offsets_url(url: str, scheme: str) -> tuple[str, list[str], list[str], dict[str, list[str]]]:
    """``scheme``HOST:PORT?group=G&topic=T's address, groups, topics and whole query."""
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    query = parse_qs(parts.query)
    groups, topics = query.get("group", []), query.get("topic", [])
    if not parts.netloc or not groups or not topics:
        raise InputError(
            "offsets", url, f"expected {scheme}HOST:PORT?group=G&topic=T (group, topic repeatable)"
        )
    return parts.netloc, groups, topics, query


def load_cluster_offsets(url: str, timeout: float = 10.0) -> list[Offsets]:
    """``namesrv://HOST:PORT?group=G&topic=T``: the offsets of every master broker in
    the topics' routes, each named, read as ``broker://`` reads one broker's."""
    import asyncio

    namesrv, groups, topics, _ = _offsets_url(url, NAMESRV_SCHEME)
    try:
        masters = asyncio.run(_route_masters(namesrv, topics, timeout))
    except Exception as exc:  # the client's RemotingError, OSError, a bad answer
        raise InputError("offsets", url, f"cannot read the routes: {exc}") from exc
    out = []
    for name, addr in sorted(masters.items()):
        try:
            one = asyncio.run(_query_broker_offsets(addr, groups, topics, [], timeout))
        except Exception as exc:
            raise InputError("offsets", url, f"cannot read {name}'s offsets: {exc}") from exc
        one.source, one.broker = f"{url} ({name} {addr})", name
        out.append(one)
    if not any(o.table for o in out):
        raise InputError("offsets", url, "the cluster has no offsets for these groups and topics")
    return out


async def _route_masters(namesrv: str, topics: list[str], timeout: float) -> dict[str, str]:
    from idemp.client.route import MASTER_ID, TopicRoute
    from idemp.client.settings import ClientSettings
    from idemp.client.transport import ResponseError, Transport
    from idemp.remoting import RequestCode, ResponseCode

    settings = ClientSettings()
    transport = Transport(sign=settings.signer(), tls=settings.tls_context())
    masters: dict[str, str] = {}
    try:
        for topic in topics:
            req = transport.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            resp = await transport.invoke(namesrv, req, timeout)
            if resp.code != ResponseCode.SUCCESS:
                raise ResponseError(resp.code, resp.remark, f"route of {topic}")
            for name, addrs in TopicRoute.parse(topic, resp.body).brokers.items():
                if MASTER_ID in addrs:
                    masters[name] = addrs[MASTER_ID]
        return masters
    finally:
        transport.close()


async def _query_broker_offsets(
    addr: str, groups: list[str], topics: list[str], queues: list[int], timeout: float
) -> Offsets:
    from idemp.client.settings import ClientSettings
    from idemp.client.transport import ResponseError, Transport
    from idemp.remoting import RequestCode, ResponseCode

    settings = ClientSettings()  # ACL and TLS from the environment (IDEMP_ACCESS_KEY …)
    transport = Transport(sign=settings.signer(), tls=settings.tls_context())

    async def call(code: int, ext: dict[str, str] | None = None) -> Any:
        return await transport.invoke(addr, transport.request(code, ext), timeout)

    try:
        resp = await call(RequestCode.GET_ALL_TOPIC_CONFIG)
        if resp.code != ResponseCode.SUCCESS:
            raise ResponseError(resp.code, resp.remark, "topic config")
        table = jsonlenient.loads(resp.body).get("topicConfigTable") or {}
        read_queues = {str(k): int(v.get("readQueueNums", 0)) for k, v in table.items()}
        out = Offsets()
        for group in groups:
            for topic in [*topics, f"%RETRY%{group}"]:
                named = queues if queues and topic in topics else None
                qids = named or list(range(read_queues.get(topic, 0)))
                for qid in qids:
                    resp = await call(
                        RequestCode.QUERY_CONSUMER_OFFSET,
                        {"consumerGroup": group, "topic": topic, "queueId": str(qid)},
                    )
                    if resp.code == ResponseCode.QUERY_NOT_FOUND:
                        continue
                    if resp.code != ResponseCode.SUCCESS:
                        raise ResponseError(resp.code, resp.remark, f"offset of {topic}@{group}")
                    out.table[(topic, group, qid)] = int(resp.ext_fields["offset"])
        return out
    finally:
        transport.close()


# ---------------------------------------------------------------------------------------
# exporters (the driver-side half of "export to Parquet, then reconcile")
# ---------------------------------------------------------------------------------------


def export_sql_table(url: str, table: str, out: str | Path, batch_rows: int = 50_000) -> int:
    """Stream a SQL table (dedup or business) to Parquet through SQLAlchemy; the
    no-JDBC-driver path. Returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    count = 0
    writer: Any = None
    try:
        with engine.connect() as conn:
            tbl = sa.Table(table, sa.MetaData(), autoload_with=conn)
            result = conn.execution_options(stream_results=True).execute(sa.select(tbl))
            names = list(result.keys())
            # types from the table, not the values: an all-NULL column keeps its type
            schema = pa.schema([(c.name, _arrow_type(pa, c.type)) for c in tbl.columns])
            while True:
                chunk = result.fetchmany(batch_rows)
                if not chunk and writer is not None:
                    break
                cols = {n: [row[i] for row in chunk] for i, n in enumerate(names)}
                batch = pa.table(cols, schema=schema)
                if writer is None:
                    Path(out).parent.mkdir(parents=True, exist_ok=True)
                    writer = pq.ParquetWriter(str(out), schema)
                writer.write_table(batch)
                count += len(chunk)
                if not chunk:
                    break
    finally:
        if writer is not None:
            writer.close()
        engine.dispose()
    return count


def _arrow_type(pa: Any, sql_type: Any) -> Any:
    import sqlalchemy as sa

    if isinstance(sql_type, sa.Boolean):
        return pa.bool_()
    if isinstance(sql_type, sa.Integer):
        return pa.int64()
    if isinstance(sql_type, (sa.Float, sa.Numeric)):
        return pa.float64()
    if isinstance(sql_type, sa.DateTime):
        return pa.timestamp("us")
    if isinstance(sql_type, sa.Date):
        return pa.date32()
    if isinstance(sql_type, sa.LargeBinary):
        return pa.binary()
    return pa.string()


def export_redis(url: str, match: str, out: str | Path, batch: int = 1000) -> int:
    """SCAN the flags matching ``match`` into Parquet with their PTTLs."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import redis

    client: Any = redis.Redis.from_url(url, decode_responses=True)
    rows: dict[str, list[Any]] = {"redis_key": [], "value": [], "pttl_ms": [], "exported_ms": []}
    now = int(time.time() * 1000)
    try:
        for key in client.scan_iter(match=match, count=batch):
            pipe = client.pipeline(transaction=False)
            pipe.type(key)
            pipe.pttl(key)
            kind, pttl = pipe.execute()
            if kind != "string":
                continue
            value = client.get(key)
            if value is None:  # expired meanwhile
                continue
            rows["redis_key"].append(key)
            rows["value"].append(value)
            rows["pttl_ms"].append(int(pttl))
            rows["exported_ms"].append(now)
    finally:
        client.close()
    schema = pa.schema(
        [
            ("redis_key", pa.string()),
            ("value", pa.string()),
            ("pttl_ms", pa.int64()),
            ("exported_ms", pa.int64()),
        ]
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows, schema=schema), str(out))
    return len(rows["redis_key"])


# Driver classes by JDBC sub-protocol: Spark is told the class, so a jar passed in
# ``spark.jars`` is found without relying on DriverManager's service discovery.
JDBC_DRIVERS = {
    "postgresql": "org.postgresql.Driver",
    "sqlite": "org.sqlite.JDBC",
    "mysql": "com.mysql.cj.jdbc.Driver",
    "mariadb": "org.mariadb.jdbc.Driver",
}
DEFAULT_RECORDS_TABLE = "idemp_dedup"  # idemp.strategies.unique_key's default table


def is_jdbc(spec: str | Path) -> bool:
    return str(spec).startswith("jdbc:")


def split_jdbc(spec: str) -> tuple[str, str]:
    """``jdbc:URL[#TABLE]`` → (URL, TABLE); the table defaults to ``idemp_dedup``
    (JDBC URLs have no fragment, so ``#`` is free to name the table)."""
    url, _, table = spec.partition("#")
    return url, table or DEFAULT_RECORDS_TABLE


def redact(url: str) -> str:
    """A JDBC URL fit for messages and the summary: no password."""
    import re

    return re.sub(r"(?i)(password=)[^&;]*", r"\1***", url)


def read_jdbc(
    spark: SparkSession, url: str, table: str, properties: dict[str, str] | None = None
) -> DataFrame:
    """Read a table over JDBC (the driver jar must be in ``spark.jars``: see
    ``session.jdbc_conf``). Spark asks the database for the schema here; the rows
    are read by the job's one pass."""
    props = dict(properties or {})
    protocol = url.split(":", 2)[1] if url.count(":") >= 2 else ""
    if "driver" not in props and protocol in JDBC_DRIVERS:
        props["driver"] = JDBC_DRIVERS[protocol]
    where = f"{redact(url)}#{table}"
    try:
        return spark.read.jdbc(url, table, properties=props)
    except Exception as exc:
        problem = _spark_error(exc)
        if "ClassNotFoundException" in problem or "No suitable driver" in problem:
            problem += " (give the driver jar with --jdbc-jars)"
        raise InputError("records", where, f"cannot be read over JDBC: {problem}") from exc


def load_jdbc_records(
    spark: SparkSession,
    spec: str,
    columns: dict[str, str] | None = None,
    properties: dict[str, str] | None = None,
) -> DataFrame:
    """The unique-key table read over JDBC (``jdbc:URL[#TABLE]``), mapped onto the
    canonical record as an exported table is (:func:`map_records`)."""
    url, table = split_jdbc(spec)
    where = f"{redact(url)}#{table}"
    df = read_jdbc(spark, url, table, properties)
    try:
        empty = len(df.head(1)) == 0
    except Exception as exc:
        raise InputError("records", where, f"cannot be read: {_spark_error(exc)}") from exc
    if empty:
        raise InputError("records", where, "is empty (no rows)")
    return map_records(df, where, columns)
