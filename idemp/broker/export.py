"""``idemp broker export``: a store's message history for reconciliation.

Reads the commit log directly (the broker may be stopped; a torn tail ends the
export, it is never repaired here) and writes one row per stored record, with a
``kind`` column so that retry, DLQ, delayed and transactional copies can be told
from the messages producers sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idemp.remoting.codes import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    SYSTEM_TOPICS,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    MessageSysFlag,
    Prop,
)
from idemp.remoting.message import MessageExt

from .commitlog import scan
from .store import is_dispatched

BATCH_ROWS = 50_000


def kind_of(msg: MessageExt) -> str:
    if msg.topic == TRANS_HALF_TOPIC:
        return "half"
    if msg.topic == TRANS_OP_HALF_TOPIC:
        return "op"
    if msg.topic == SCHEDULE_TOPIC:
        return "scheduled"
    if msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return "retry"
    if msg.topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
        return "dlq"
    if msg.topic in SYSTEM_TOPICS:
        return "system"
    return "message"


def row_of(msg: MessageExt, with_body: bool) -> dict[str, Any]:
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
        "visible": is_dispatched(msg.sys_flag),
        "retry_topic": props.get(Prop.RETRY_TOPIC),
        "origin_msg_id": props.get(Prop.ORIGIN_MESSAGE_ID),
        "real_topic": props.get(Prop.REAL_TOPIC),
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
]


def arrow_schema() -> Any:
    """SCHEMA_FIELDS as a pyarrow schema (pyarrow spells bool ``bool_``)."""
    import pyarrow as pa

    return pa.schema([pa.field(n, getattr(pa, "bool_" if t == "bool" else t)())
                      for n, t in SCHEMA_FIELDS])


def rows(store_dir: Path, with_body: bool) -> Iterator[dict[str, Any]]:
    for msg in scan(store_dir / "commitlog"):
        yield row_of(msg, with_body)


def export(
    store_dir: str | Path, out: str | Path, fmt: str | None = None, with_body: bool = False
) -> int:
    """Write the history; return the number of rows."""
    store_dir, out = Path(store_dir), Path(out)
    if not (store_dir / "commitlog").is_dir():
        raise FileNotFoundError(f"{store_dir} is not a broker store (no commitlog/ directory)")
    fmt = fmt or ("jsonl" if out.suffix in (".jsonl", ".json") else "parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    if fmt == "jsonl":
        with open(out, "w", encoding="utf-8") as fh:
            for row in rows(store_dir, with_body):
                fh.write(json.dumps(row) + "\n")
                count += 1
        return count
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    with pq.ParquetWriter(out, schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows(store_dir, with_body):
            batch.append(row)
            if len(batch) >= BATCH_ROWS:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
                batch = []
        if batch or count == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count


def run_export(store: str, out: str, fmt: str | None, with_body: bool) -> int:
    try:
        n = export(store, out, fmt, with_body)
    except (OSError, ValueError) as exc:
        print(f"idemp broker export: {exc}", file=sys.stderr)
        return 1
    print(f"exported {n} messages from {store} to {out}")
    return 0
