"""The small, fixed schemas every loader maps its source onto.

Each source (a broker export, a SQL table export, a Redis SCAN export, a business
table, an offsets file) has its own columns; the loaders rename and cast them onto
the canonical schemas below, so the job itself sees one shape per input and a change
in a source's layout is a one-place fix in ``loaders.py``.

Types are named with Spark SQL's simple type strings so the same table drives
validation, JSON-lines reading and documentation.
"""

from __future__ import annotations

# --- message history (``idemp broker export`` / ``idemp history pull``) -------------
# Only the columns the job reads; an export may carry more (they are ignored).
HISTORY_REQUIRED: list[tuple[str, str]] = [
    ("topic", "string"),
    ("queue_id", "int"),
    ("queue_offset", "bigint"),
    ("msg_id", "string"),
    ("keys", "string"),
    ("body_sha256", "string"),
    ("store_timestamp", "bigint"),
    ("reconsume_times", "int"),
    ("kind", "string"),
    ("retry_topic", "string"),
    ("real_topic", "string"),
]
# Read only when the configuration needs them (or present: ``visible``, ``broker``: the
# broker name a record is stored on, which a cluster of several brokers needs).
HISTORY_OPTIONAL: list[tuple[str, str]] = [
    ("visible", "boolean"),
    ("broker", "string"),
    ("properties", "string"),
    ("body", "string"),
]

# --- dedup records: the canonical record every dedup store is mapped onto ----------
# namespace: consumer group + topic (see ``job.Subscription.namespace``);
# key: the business key; status: CONSUMING | CONSUMED (other values are kept, and
# count as neither); times are epoch milliseconds; source names the input file.
RECORD_FIELDS: list[tuple[str, str]] = [
    ("namespace", "string"),
    ("key", "string"),
    ("status", "string"),
    ("deadline_ms", "bigint"),
    ("expires_ms", "bigint"),
    ("fingerprint", "string"),
    ("attempts", "int"),
    ("owner", "string"),
    ("updated_ms", "bigint"),
]
CONSUMED = "CONSUMED"
CONSUMING = "CONSUMING"

# --- business effects: one row per effect a handler wrote (e.g. a points row) -------
EFFECT_FIELDS: list[tuple[str, str]] = [("namespace", "string"), ("key", "string")]

# --- committed consumer offsets (consumerOffset.json / QUERY_CONSUMER_OFFSET) --------
# ``offset`` is the next offset to consume: messages below it were acknowledged.
# ``broker``: the broker name the queue is on (null: one broker, not named).
OFFSET_FIELDS: list[tuple[str, str]] = [
    ("topic", "string"),
    ("group", "string"),
    ("queue_id", "int"),
    ("offset", "bigint"),
    ("broker", "string"),
]

# --- classes ---------------------------------------------------------------------------
# Flags a business key can carry (several at once); the summary counts each flag.
# ``PRIMARY_ORDER`` picks one class per key for the report (first flag that is set).
DISCREPANCY_CLASSES = [
    "doubled",
    "lost",
    "effect_missing",
    "stuck",
    "conflict",
    "dead_lettered",
    "record_missing",
    "orphan",
    "orphan_effect",
    "pending",
]
BENIGN_CLASSES = ["duplicate_absorbed", "ok"]
PRIMARY_ORDER = DISCREPANCY_CLASSES + BENIGN_CLASSES + ["other"]
# Exit non-zero when any of these exceeds its threshold (default 0); settable.
DEFAULT_FAIL_ON = {"doubled": 0, "lost": 0, "stuck": 0, "effect_missing": 0}
# Deliveries-per-key histogram buckets: 1..9 and "10+".
HISTOGRAM_BUCKETS = 10


def ddl(fields: list[tuple[str, str]]) -> str:
    """A Spark DDL string (``"a string, b bigint"``) for ``spark.read.schema``."""
    return ", ".join(f"`{name}` {typ}" for name, typ in fields)
