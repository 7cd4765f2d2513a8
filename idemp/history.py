"""The message-history rows that reconciliation reads, and how they are written.

Shared by ``idemp broker export`` (a store's commit log read from disk) and
``idemp history pull`` (the same records pulled from a live broker), so both write
exactly one schema. It depends on ``idemp.remoting`` only: the broker and the client
may both import it without importing each other.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from idemp.remoting.codes import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    SYSTEM_TOPICS,
    TIMER_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    MessageSysFlag,
    Prop,
)
from idemp.remoting.message import MessageExt

BATCH_ROWS = 50_000


def is_visible(sys_flag: int) -> bool:
    """Prepared and rolled-back records never reach a consume queue (the broker's
    store uses this same rule to dispatch)."""
    t = sys_flag & MessageSysFlag.TRANSACTION_MASK
    return t in (MessageSysFlag.TRANSACTION_NOT_TYPE, MessageSysFlag.TRANSACTION_COMMIT)


def kind_of(msg: MessageExt) -> str:
    if msg.topic == TRANS_HALF_TOPIC:
        return "half"
    if msg.topic == TRANS_OP_HALF_TOPIC:
        return "op"
    if msg.topic == SCHEDULE_TOPIC:
        return "scheduled"
    if msg.topic == TIMER_TOPIC:  # waiting for its delivery time, or a recall's marker
        return "system" if Prop.TIMER_DEL_UNIQKEY in msg.properties else "scheduled"
    if msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return "retry"
    if msg.topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
        return "dlq"
    if msg.topic in SYSTEM_TOPICS or msg.topic.startswith(SYSTEM_TOPIC_PREFIX):
        return "system"
    return "message"


def row_of(msg: MessageExt, with_body: bool, broker: str | None = None) -> dict[str, Any]:
    """One row per stored record; ``msg`` as stored (body not yet decompressed);
    ``broker``: the name of the broker it is stored on (a queue is broker + queue id)."""
    body = msg.body
    if msg.sys_flag & MessageSysFlag.COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error:
            pass
    props = msg.properties
    return {
        "topic": msg.topic,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commit_log_offset": msg.commit_log_offset,
        "offset_msg_id": msg.offset_msg_id,
        "msg_id": props.get(Prop.UNIQ_KEY) or msg.offset_msg_id,
        "uniq_key": props.get(Prop.UNIQ_KEY),
        "keys": props.get(Prop.KEYS),
        "tags": props.get(Prop.TAGS),
        "properties": json.dumps(props, sort_keys=True),
        "body_size": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body": base64.b64encode(body).decode() if with_body else None,
        "born_timestamp": msg.born_timestamp,
        "store_timestamp": msg.store_timestamp,
        "born_host": f"{msg.born_host[0]}:{msg.born_host[1]}",
        "store_host": f"{msg.store_host[0]}:{msg.store_host[1]}",
        "reconsume_times": msg.reconsume_times,
        "sys_flag": msg.sys_flag,
        "kind": kind_of(msg),
        "visible": is_visible(msg.sys_flag),
        "retry_topic": props.get(Prop.RETRY_TOPIC),
        "origin_msg_id": props.get(Prop.ORIGIN_MESSAGE_ID),
        "real_topic": props.get(Prop.REAL_TOPIC),
        "broker": broker,
    }


SCHEMA_FIELDS: list[tuple[str, str]] = [
    ("topic", "string"),
    ("queue_id", "int32"),
    ("queue_offset", "int64"),
    ("commit_log_offset", "int64"),
    ("offset_msg_id", "string"),
    ("msg_id", "string"),
    ("uniq_key", "string"),
    ("keys", "string"),
    ("tags", "string"),
    ("properties", "string"),
    ("body_size", "int64"),
    ("body_sha256", "string"),
    ("body", "string"),
    ("born_timestamp", "int64"),
    ("store_timestamp", "int64"),
    ("born_host", "string"),
    ("store_host", "string"),
    ("reconsume_times", "int32"),
    ("sys_flag", "int32"),
    ("kind", "string"),
    ("visible", "bool"),
    ("retry_topic", "string"),
    ("origin_msg_id", "string"),
    ("real_topic", "string"),
    ("broker", "string"),
]


def arrow_schema() -> Any:
    """SCHEMA_FIELDS as a pyarrow schema (pyarrow spells bool ``bool_``)."""
    import pyarrow as pa

    return pa.schema(
        [pa.field(n, getattr(pa, "bool_" if t == "bool" else t)()) for n, t in SCHEMA_FIELDS]
    )


def format_of(out: Path, fmt: str | None) -> str:
    return fmt or ("jsonl" if out.suffix in (".jsonl", ".json") else "parquet")


def write_rows(rows: Iterable[dict[str, Any]], out: str | Path, fmt: str | None = None) -> int:
    """Write ``rows`` as Parquet (``arrow_schema()``) or JSON lines; return the count."""
    out = Path(out)
    fmt = format_of(out, fmt)
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    if fmt == "jsonl":
        with open(out, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
                count += 1
        return count
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    with pq.ParquetWriter(out, schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= BATCH_ROWS:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
                batch = []
        if batch or count == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count
