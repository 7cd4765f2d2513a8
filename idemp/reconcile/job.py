"""The reconciliation itself: pure DataFrame transformations, no driver-side rows.

Vocabulary (docs/reconcile.md has the long form):

* **Subscription**: a (consumer group, topic) pair; its **namespace** is the string the
  dedup store files its records under (``{group}/{topic}``, as ``idemp.keys.Namespace``, unless
  configured).
* **Business key** of a stored message: by default its first ``KEYS`` token; or a
  property (``property:NAME``) or a JSON path into the body (``json:$.order.id``).
* **Copies** of a key, attributed to a subscription (group G, topic T):
  ``message`` rows in T (one per producer send; a producer retry is a second row with
  a new msgId) — counted for every subscribed group; ``retry`` rows in ``%RETRY%G``
  whose ``retry_topic`` is T (a redelivery after RECONSUME_LATER, same KEYS);
  ``dlq`` rows in ``%DLQ%G`` whose ``retry_topic`` is T (RocketMQ 5: or ``%RETRY%G_T``,
  the POP retry topic it came from); ``scheduled`` rows waiting in
  the delay topic, aimed at ``%RETRY%G`` (a retry in flight) or at T itself (a delayed
  send). Half, op and system rows are never attributed.
* **Deliveries** = messages + retry copies. A copy is **committed** when its queue
  offset is below the group's committed offset for its own topic and queue
  (``T@G`` for messages, ``%RETRY%G@G`` for retry copies).

Everything per key stays in executors; the driver sees only the per-(group, topic,
day) totals and bounded samples (see ``report.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from idemp.remoting.codes import TIMER_TOPIC, Prop

from .schemas import (
    BENIGN_CLASSES,
    CONSUMED,
    CONSUMING,
    DISCREPANCY_CLASSES,
    HISTOGRAM_BUCKETS,
    PRIMARY_ORDER,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

DEFAULT_NAMESPACE = "{group}/{topic}"  # idemp.keys.Namespace's default
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
LONG_KEY = 200  # idemp.strategies.unique_key._LONG_KEY


@dataclass(frozen=True)
class Subscription:
    group: str
    topic: str
    namespace: str

    @classmethod
    def of(cls, group: str, topic: str, template: str = DEFAULT_NAMESPACE) -> Subscription:
        return cls(group, topic, template.format(group=group, topic=topic))


@dataclass
class JobConfig:
    subscriptions: Sequence[Subscription]
    as_of_ms: int
    key_from: str = "keys"
    # "sha256": a record's fingerprint is the SHA-256 hex of the body and must match
    # the history's; "none": record fingerprints are opaque (only compared together).
    fingerprint: str = "none"
    effect_namespaces: frozenset[str] = field(default_factory=frozenset)

    def history_columns(self) -> set[str]:
        """Optional history columns this configuration needs."""
        if self.key_from.startswith("property:"):
            return {"properties"}
        if self.key_from.startswith("json:"):
            return {"body"}
        return set()


def key_expr(key_from: str) -> Column:
    """The business key of a history row, or null when it has none."""
    from pyspark.sql import functions as F

    if key_from == "keys":
        raw = F.split(F.trim(F.col("keys")), " ", 2).getItem(0)
    elif key_from.startswith("property:"):
        name = key_from.split(":", 1)[1].replace("'", "\\'")
        raw = F.get_json_object("properties", f"$['{name}']")
    elif key_from.startswith("json:"):
        path = key_from.split(":", 1)[1]
        if not path.startswith("$"):
            path = "$." + path
        raw = F.get_json_object(F.unbase64("body").cast("string"), path)
    else:
        raise ValueError(f"key source {key_from!r}: use keys, property:NAME or json:$.path")
    return F.when(F.length(raw) > 0, normal_key(raw))


def normal_key(raw: Column) -> Column:
    """Every side's keys compared in one form: as idemp.strategies.unique_key.stored_key,
    a key over 200 characters becomes ``sha256:<hex>`` (the SQL table stores it so, Redis
    and effect tables keep it as written). A stored hash is short, so it stays as is."""
    from pyspark.sql import functions as F

    return F.when(F.length(raw) > LONG_KEY, F.concat(F.lit("sha256:"), F.sha2(raw, 256))).otherwise(
        raw
    )


def subscriptions_df(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    rows = [
        (s.group, s.topic, s.namespace, s.namespace in cfg.effect_namespaces)
        for s in cfg.subscriptions
    ]
    schema = "`group` string, topic string, namespace string, has_effects boolean"
    return spark.createDataFrame(rows, schema=schema)


def _without_recalled(history: DataFrame) -> DataFrame:
    """RocketMQ 5's timer rows: a message waiting for its delivery time is a scheduled
    copy, unless a recall's marker names it (``<real topic>+<message id>``): then it will
    never be delivered and is no copy at all. Only the timer's rows (a few) are read
    again and shuffled, by the name a marker gives."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if "properties" not in history.columns:  # a history without them: nothing to match
        return history
    in_timer = F.col("topic") == TIMER_TOPIC
    marker = F.col("kind") == "system"
    named = F.when(
        marker, F.get_json_object("properties", f"$.{Prop.TIMER_DEL_UNIQKEY}")
    ).otherwise(F.concat(F.col("real_topic"), F.lit("+"), F.col("msg_id")))
    recalled = F.max(marker.cast("int")).over(Window.partitionBy("_named")) == 1
    timer = history.where(in_timer).withColumn("_named", named)
    timer = timer.withColumn("_recalled", recalled)
    waiting = timer.where((F.col("kind") == "scheduled") & ~F.col("_recalled"))
    return history.where(~in_timer).unionByName(waiting.drop("_named", "_recalled"))


def attributed_history(
    history: DataFrame, subs: DataFrame, offsets: DataFrame, cfg: JobConfig
) -> DataFrame:
    """One row per (history copy, subscribed group), with its key, role and whether
    its offset is committed."""
    from pyspark.sql import functions as F

    history = _without_recalled(history)
    kind, topic, real = F.col("kind"), F.col("topic"), F.col("real_topic")
    retry_topic = F.col("retry_topic")
    sched_retry = (kind == "scheduled") & real.startswith(RETRY_PREFIX)
    # a RocketMQ 5 POP retry lives in %RETRY%<group>_<topic>; its first pop's time tells
    # it from the 4.x retry topic of a group that happens to be named <group>_<topic>
    popped = (
        F.get_json_object("properties", f"$['{Prop.FIRST_POP_TIME}']").isNotNull()
        if "properties" in history.columns
        else F.lit(False)
    )
    # RocketMQ 5.3.3 names no topic in a POP retry copy (nor does idemp's broker; before
    # 2026-11-27 it wrote the original), and a dead letter that came from one names the
    # POP retry topic: both are matched below against each subscription's POP retry topics
    pop_name = F.when(
        (kind == "retry") & popped & (retry_topic.isNull() | (retry_topic == "")), topic
    ).when((kind == "dlq") & retry_topic.startswith(RETRY_PREFIX), retry_topic)
    att_topic = (
        F.when(pop_name.isNotNull(), F.lit(None).cast("string"))
        .when((kind == "message") & F.col("visible"), topic)
        .when(kind.isin("retry", "dlq") | sched_retry, retry_topic)
        .when(kind == "scheduled", real)
    )
    pop_retry = (
        (kind == "retry") & popped & topic.endswith(F.concat(F.lit("_"), F.col("retry_topic")))
    )
    start = len(RETRY_PREFIX) + 1
    att_group = (
        F.when(
            pop_retry,
            F.expr(f"substring(topic, {start}, length(topic) - length(retry_topic) - {start})"),
        )
        .when(kind == "retry", F.expr(f"substring(topic, {start})"))
        .when(kind == "dlq", F.expr(f"substring(topic, {len(DLQ_PREFIX) + 1})"))
        .when(sched_retry, F.expr(f"substring(real_topic, {len(RETRY_PREFIX) + 1})"))
    )
    role = (
        F.when(sched_retry, F.lit("sched_retry"))
        .when(kind == "scheduled", F.lit("sched_user"))
        .otherwise(kind)
    )
    h = history.select(
        att_topic.alias("att_topic"),
        att_group.alias("att_group"),
        role.alias("role"),
        F.col("topic").alias("copy_topic"),
        "broker",
        "queue_id",
        "queue_offset",
        "msg_id",
        "body_sha256",
        "store_timestamp",
        key_expr(cfg.key_from).alias("key"),
        pop_name.alias("pop_name"),
    ).where(F.col("att_topic").isNotNull() | F.col("pop_name").isNotNull())
    s = F.broadcast(subs.select("group", "topic", "namespace"))
    pop_v1 = F.concat(F.lit(RETRY_PREFIX), s.group, F.lit("_"), s.topic)
    pop_v2 = F.concat(F.lit(RETRY_PREFIX), s.group, F.lit("+"), s.topic)  # enableRetryTopicV2
    joined = h.join(
        s,
        ((h.att_topic == s.topic) & (h.att_group.isNull() | (h.att_group == s.group)))
        | (h.pop_name.isin(pop_v1, pop_v2) & ((h.role != "dlq") | (h.att_group == s.group))),
        "inner",
    ).drop("att_topic", "att_group", "pop_name")
    o = F.broadcast(
        offsets.select(
            F.col("topic").alias("o_topic"),
            F.col("group").alias("o_group"),
            F.col("queue_id").alias("o_queue"),
            F.col("offset").alias("committed_offset"),
            F.col("broker").alias("o_broker"),
        )
    )
    # A queue is (broker, queue id); an unnamed side stands for the one broker there is
    # (check_brokers refused the inputs where that would be ambiguous).
    same_broker = o.o_broker.isNull() | joined.broker.isNull() | (joined.broker == o.o_broker)
    joined = joined.join(
        o,
        (joined.copy_topic == o.o_topic)
        & (joined.group == o.o_group)
        & (joined.queue_id == o.o_queue)
        & same_broker,
        "left",
    )
    delivered = F.col("role").isin("message", "retry")
    committed = F.coalesce(F.col("queue_offset") < F.col("committed_offset"), F.lit(False))
    return joined.select(
        "group",
        "topic",
        "namespace",
        "key",
        "role",
        "msg_id",
        "body_sha256",
        "store_timestamp",
        (delivered & committed).alias("committed"),
        (delivered & ~committed).alias("uncommitted"),
    )


def _count(cond: Column) -> Column:
    from pyspark.sql import functions as F

    return F.sum(F.when(cond, 1).otherwise(0)).cast("bigint")


def _flag(cond: Column) -> Column:
    """1 where ``cond`` holds, else 0: summed per key, it counts the rows."""
    from pyspark.sql import functions as F

    return F.when(cond, F.lit(1)).otherwise(F.lit(0)).cast("int")


# The per-key aggregate's inputs: every source is projected onto these columns (nulls
# for another source's fields) and the three are aggregated in one pass, so the job
# shuffles each row once and joins nothing per key (no sort-merge join, no broadcast
# of a per-key table).
_EVENT_COLUMNS: list[tuple[str, str]] = [
    # history copies
    ("h_rows", "int"),
    ("h_msg", "int"),
    ("h_retry", "int"),
    ("h_dlq", "int"),
    ("h_sched_retry", "int"),
    ("h_sched_user", "int"),
    ("h_committed", "int"),
    ("h_uncommitted", "int"),
    ("h_sha", "bigint"),
    ("h_ts", "bigint"),
    # dedup records
    ("r_rows", "int"),
    ("r_rank", "int"),
    ("r_deadline", "bigint"),
    ("r_expires", "bigint"),
    ("r_fp", "bigint"),
    ("r_updated", "bigint"),
    # business effects
    ("e_rows", "int"),
]


def _events(values: dict[str, Column]) -> list[Column]:
    from pyspark.sql import functions as F

    return [
        (values[name] if name in values else F.lit(None)).cast(typ).alias(name)
        for name, typ in _EVENT_COLUMNS
    ]


def history_events(att: DataFrame) -> DataFrame:
    """Attributed history rows as aggregate inputs (one row per copy and group)."""
    from pyspark.sql import functions as F

    role = F.col("role")
    is_msg = role == "message"
    # hashes instead of strings: fixed-width min/max keep the aggregate a hash aggregate
    return att.select(
        "namespace",
        "key",
        *_events(
            {
                "h_rows": F.lit(1),
                "h_msg": _flag(is_msg),
                "h_retry": _flag(role == "retry"),
                "h_dlq": _flag(role == "dlq"),
                "h_sched_retry": _flag(role == "sched_retry"),
                "h_sched_user": _flag(role == "sched_user"),
                "h_committed": _flag(F.col("committed")),
                "h_uncommitted": _flag(F.col("uncommitted")),
                "h_sha": F.when(is_msg, F.xxhash64("body_sha256")),
                "h_ts": F.col("store_timestamp"),
            }
        ),
    )


def record_events(records: DataFrame) -> DataFrame:
    """Dedup records as aggregate inputs. A key with rows in several stores keeps the
    most advanced status (CONSUMED over CONSUMING over anything else, ``OTHER``)."""
    from pyspark.sql import functions as F

    status = F.col("status")
    return records.where(F.col("key").isNotNull()).select(
        "namespace",
        normal_key(F.col("key")).alias("key"),
        *_events(
            {
                "r_rows": F.lit(1),
                "r_rank": F.when(status == CONSUMED, 2).when(status == CONSUMING, 1).otherwise(0),
                "r_deadline": F.col("deadline_ms"),
                "r_expires": F.col("expires_ms"),
                "r_fp": F.when(F.col("fingerprint").isNotNull(), F.xxhash64("fingerprint")),
                "r_updated": F.col("updated_ms"),
            }
        ),
    )


def effect_events(effects: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return effects.where(F.col("key").isNotNull()).select(
        "namespace", normal_key(F.col("key")).alias("key"), *_events({"e_rows": F.lit(1)})
    )


def per_key(att: DataFrame, records: DataFrame, effects: DataFrame | None) -> DataFrame:
    """Counts per (namespace, key) from all three sources in one aggregation.

    Only fixed-width aggregates (sums, min/max of longs), so Spark uses a hash
    aggregate, not a sort. A key known only from effect rows is kept: an orphan effect.
    """
    from pyspark.sql import functions as F

    events = history_events(att).unionByName(record_events(records))
    if effects is not None:
        events = events.unionByName(effect_events(effects))
    c = F.col
    agg = events.groupBy("namespace", "key").agg(
        F.sum("h_rows").alias("h_rows"),
        F.sum("h_msg").alias("n_messages"),
        F.sum("h_retry").alias("n_retries"),
        F.sum("h_dlq").alias("n_dlq"),
        F.sum("h_sched_retry").alias("n_sched_retry"),
        F.sum("h_sched_user").alias("n_sched_user"),
        F.sum("h_committed").alias("n_committed"),
        F.sum("h_uncommitted").alias("n_uncommitted"),
        F.min("h_sha").alias("sha_min"),
        F.max("h_sha").alias("sha_max"),
        F.min("h_ts").alias("first_ts"),
        F.max("h_ts").alias("last_ts"),
        F.sum("r_rows").alias("n_records"),
        F.max("r_rank").alias("status_rank"),
        F.max("r_deadline").alias("deadline_ms"),
        F.max("r_expires").alias("expires_ms"),
        F.min("r_fp").alias("fp_min"),
        F.max("r_fp").alias("fp_max"),
        F.max("r_updated").alias("updated_ms"),
        F.sum("e_rows").alias("n_effects"),
    )
    r = c("status_rank")
    status = (
        F.when(r == 2, F.lit(CONSUMED)).when(r == 1, F.lit(CONSUMING)).when(r == 0, F.lit("OTHER"))
    )
    return agg.withColumn("status", status).drop("status_rank", "h_rows")


def classify(
    spark: SparkSession,
    history: DataFrame,
    records: DataFrame,
    effects: DataFrame | None,
    offsets: DataFrame,
    cfg: JobConfig,
) -> DataFrame:
    """One row per (namespace, business key) with counts, flags and a primary class.

    Flags (several may hold): see ``docs/reconcile.md`` and the expressions below;
    the row with a null key collects a subscription's messages that have no key.
    """
    from pyspark.sql import functions as F

    subs = subscriptions_df(spark, cfg)
    att = attributed_history(history, subs, offsets, cfg)
    joined = per_key(att, records, effects)
    s = F.broadcast(
        subs.select(
            F.col("namespace").alias("s_ns"),
            F.col("group").alias("s_group"),
            F.col("topic").alias("s_topic"),
            "has_effects",
        )
    )
    df = joined.join(s, joined.namespace == s.s_ns, "left")
    c = F.col
    zero = F.lit(0).cast("bigint")
    nz = {
        n: F.coalesce(c(n), zero)
        for n in (
            "n_messages",
            "n_retries",
            "n_dlq",
            "n_sched_retry",
            "n_sched_user",
            "n_committed",
            "n_uncommitted",
            "n_records",
        )
    }
    measured = F.coalesce(c("has_effects"), F.lit(False))
    n_effects = F.when(measured, F.coalesce(c("n_effects"), zero))
    inflight = F.greatest(nz["n_sched_retry"] - nz["n_retries"], zero) + F.greatest(
        nz["n_sched_user"] - nz["n_messages"], zero
    )
    df = df.select(
        c("s_group").alias("group"),
        c("s_topic").alias("topic"),
        "namespace",
        "key",
        F.to_date(F.timestamp_millis(F.coalesce(c("first_ts"), c("updated_ms")))).alias("day"),
        nz["n_messages"].alias("n_messages"),
        nz["n_retries"].alias("n_retries"),
        (nz["n_messages"] + nz["n_retries"]).alias("n_deliveries"),
        nz["n_dlq"].alias("n_dlq"),
        nz["n_committed"].alias("n_committed"),
        (nz["n_uncommitted"] + inflight).alias("n_outstanding"),
        nz["n_records"].alias("n_records"),
        "status",
        "deadline_ms",
        "expires_ms",
        "fp_min",
        "fp_max",
        "sha_min",
        "sha_max",
        n_effects.alias("n_effects"),
        measured.alias("effects_measured"),
        "first_ts",
        "last_ts",
        c("s_ns").isNotNull().alias("in_scope"),
    )
    return df.select("*", *_flags(cfg)).select("*", _primary().alias("class"))


def _flags(cfg: JobConfig) -> list[Column]:
    from pyspark.sql import functions as F

    c = F.col
    keyed = c("key").isNotNull() & c("in_scope")
    has_copies = (c("n_messages") + c("n_retries") + c("n_dlq")) > 0
    consumed = F.coalesce(c("status") == CONSUMED, F.lit(False))
    consuming = F.coalesce(c("status") == CONSUMING, F.lit(False))
    stuck = consuming & F.coalesce(c("deadline_ms") < F.lit(cfg.as_of_ms), F.lit(False))
    fresh = consuming & ~stuck
    measured = c("effects_measured")
    effects = F.coalesce(c("n_effects"), F.lit(0))
    # one effect: the dedup record says CONSUMED and (if measured) one effect row
    effect_once = consumed & (~measured | (effects == 1))
    dead = c("n_dlq") > 0
    outstanding = c("n_outstanding") > 0
    conflict = (c("sha_min") != c("sha_max")) | (c("fp_min") != c("fp_max"))
    if cfg.fingerprint == "sha256":
        conflict = conflict | (c("fp_min").isNotNull() & (c("fp_min") != c("sha_min")))
        # (both are xxhash64 of the hex strings: equal strings, equal hashes)
    doubled = measured & (effects > 1)
    flags: dict[str, Column] = {
        "doubled": keyed & doubled,
        # Every copy acknowledged, none dead-lettered, yet no CONSUMED record and no
        # effect: the message is gone for good.
        "lost": keyed
        & has_copies
        & ~outstanding
        & ~dead
        & ~consumed
        & ~fresh
        & (~measured | (effects == 0)),
        "effect_missing": keyed & has_copies & measured & consumed & (effects == 0),
        "stuck": keyed & stuck,
        "conflict": keyed & F.coalesce(conflict, F.lit(False)),
        "dead_lettered": keyed & dead,
        "record_missing": keyed & has_copies & measured & (effects > 0) & (c("n_records") == 0),
        "orphan": keyed & ~has_copies & (c("n_records") > 0),
        "orphan_effect": keyed & ~has_copies & (c("n_records") == 0) & measured & (effects > 0),
        "pending": keyed & outstanding & ~consumed & ~(measured & (effects > 0)),
        "duplicate_absorbed": keyed & (c("n_deliveries") > 1) & effect_once,
        "ok": keyed & (c("n_deliveries") == 1) & effect_once,
    }
    assert list(flags) == DISCREPANCY_CLASSES + BENIGN_CLASSES
    return [F.coalesce(v, F.lit(False)).alias(k) for k, v in flags.items()]


def _primary() -> Column:
    """The first flag in ``PRIMARY_ORDER`` that holds (a clean key: ``ok``)."""
    from pyspark.sql import functions as F

    c = F.col
    expr = F.when(~c("in_scope"), F.lit("out_of_scope")).when(c("key").isNull(), F.lit("unkeyed"))
    for name in PRIMARY_ORDER[:-1]:
        expr = expr.when(c(name), F.lit(name))
    return expr.otherwise(F.lit(PRIMARY_ORDER[-1]))


def totals(keys: DataFrame) -> DataFrame:
    """Per (group, topic, day): keys, messages, deliveries, each flag, and the
    deliveries-per-key histogram. Small: one row per subscription and day."""
    from pyspark.sql import functions as F

    c = F.col
    keyed = c("key").isNotNull() & c("in_scope")
    bucket = F.least(c("n_deliveries"), F.lit(HISTOGRAM_BUCKETS))
    aggs = [
        _count(keyed).alias("keys"),
        F.sum(F.when(keyed, c("n_messages")).otherwise(0)).cast("bigint").alias("messages"),
        F.sum(F.when(keyed, c("n_deliveries")).otherwise(0)).cast("bigint").alias("deliveries"),
        F.sum(F.when(c("key").isNull(), c("n_messages")).otherwise(0))
        .cast("bigint")
        .alias("unkeyed_messages"),
        _count(~c("in_scope")).alias("out_of_scope_records"),
        _count(c("class") == "other").alias("other"),
    ]
    aggs += [_count(c(name)).alias(name) for name in DISCREPANCY_CLASSES + BENIGN_CLASSES]
    aggs += [
        _count(keyed & (bucket == i)).alias(f"deliveries_{i}")
        for i in range(0, HISTOGRAM_BUCKETS + 1)
    ]
    return keys.groupBy("group", "topic", "day").agg(*aggs)


def discrepancies(keys: DataFrame) -> DataFrame:
    """One row per (key, discrepancy class it has): the rows behind every count."""
    from pyspark.sql import functions as F

    any_flag = F.lit(False)
    for name in DISCREPANCY_CLASSES:
        any_flag = any_flag | F.col(name)
    names = F.array(*[F.when(F.col(n), F.lit(n)) for n in DISCREPANCY_CLASSES])
    cols = [c for c in keys.columns if c not in DISCREPANCY_CLASSES + BENIGN_CLASSES]
    return keys.where(any_flag).select(
        *cols, F.explode(F.array_compact(names)).alias("discrepancy")
    )
