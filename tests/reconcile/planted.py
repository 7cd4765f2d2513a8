"""A small planted dataset where every class appears with a known count.

Two subscriptions: ``g1`` on ``orders`` (with an effects table: the points rows) and
``g2`` on ``payments`` (no effects table: a CONSUMED record stands for the effect).
Committed offsets: orders@g1 queue 0 → 100, %RETRY%g1@g1 queue 0 → 10,
payments@g2 queue 0 → 100. ``EXPECTED`` lists every key's flags.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from idemp.broker.export import arrow_schema

AS_OF = 1_700_000_000_000
DAY0 = 1_699_920_000_000  # 2023-11-14 00:00 UTC
NS1, NS2 = "g1/orders", "g2/payments"
FAR = AS_OF + 3_600_000
PAST = AS_OF - 60_000


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Builder:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.offsets: dict[str, int] = {}
        self.records: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        self._n = 0

    def msg(
        self,
        topic: str,
        key: str | None,
        offset: int,
        *,
        kind: str = "message",
        body: str | None = None,
        retry_topic: str | None = None,
        real_topic: str | None = None,
        msg_id: str | None = None,
        reconsume: int = 0,
        ts: int = DAY0 + 3_600_000,
        visible: bool = True,
        extra_props: dict[str, str] | None = None,
    ) -> str:
        self._n += 1
        msg_id = msg_id or f"MSG{self._n:06d}"
        body = body if body is not None else f"body-{key}"
        props: dict[str, str] = {"UNIQ_KEY": msg_id}
        if key is not None:
            props["KEYS"] = key
        props.update(extra_props or {})
        self.rows.append(
            {
                "topic": topic,
                "queue_id": 0,
                "queue_offset": offset,
                "commit_log_offset": self._n * 100,
                "offset_msg_id": f"OFF{self._n:06d}",
                "msg_id": msg_id,
                "uniq_key": msg_id,
                "keys": key,
                "tags": None,
                "properties": json.dumps(props),
                "body_size": len(body),
                "body_sha256": sha(body),
                "body": None,
                "born_timestamp": ts,
                "store_timestamp": ts,
                "born_host": "127.0.0.1:1",
                "store_host": "127.0.0.1:2",
                "reconsume_times": reconsume,
                "sys_flag": 0,
                "kind": kind,
                "visible": visible,
                "retry_topic": retry_topic,
                "origin_msg_id": None,
                "real_topic": real_topic,
            }
        )
        return msg_id

    def record(
        self, ns: str, key: str, status: str, deadline: int | None = None, fp: str | None = None
    ) -> None:
        self.records.append(
            {
                "namespace": ns,
                "key": key,
                "status": status,
                "deadline": deadline,
                "expiry": AS_OF + 86_400_000,
                "fingerprint": fp,
                "attempts": 1,
                "owner": "c1",
                "updated_at": AS_OF - 1000,
            }
        )

    def effect(self, key: str) -> None:
        self.effects.append({"order_id": key, "points": 10})


def build() -> tuple[Builder, dict[tuple[str, str], set[str]]]:
    """The dataset and, per (namespace, key), the exact set of flags expected."""
    b = Builder()
    exp: dict[tuple[str, str], set[str]] = {}
    o = iter(range(0, 100))  # committed offsets in orders queue 0
    late = iter(range(100, 200))  # not yet committed
    T, R, D, S = "orders", "%RETRY%g1", "%DLQ%g1", "SCHEDULE_TOPIC_XXXX"

    def done(key: str, effects: int = 1, status: str = "CONSUMED") -> None:
        b.record(NS1, key, status)
        for _ in range(effects):
            b.effect(key)

    # ok: one delivery, one effect (3), plus one consumed but whose offset lags (1)
    for k in ("ok-1", "ok-2", "ok-3"):
        b.msg(T, k, next(o))
        done(k)
        exp[(NS1, k)] = {"ok"}
    b.msg(T, "ok-lag", next(late))
    done("ok-lag")
    exp[(NS1, "ok-lag")] = {"ok"}
    # duplicate absorbed: a producer retry (2 messages); a redelivery via %RETRY%
    b.msg(T, "dup-1", next(o))
    b.msg(T, "dup-1", next(o))
    done("dup-1")
    exp[(NS1, "dup-1")] = {"duplicate_absorbed"}
    mid = b.msg(T, "dup-2", next(o))
    b.msg(S, "dup-2", 0, kind="scheduled", msg_id=mid, retry_topic=T, real_topic=R, reconsume=1)
    b.msg(R, "dup-2", 0, kind="retry", msg_id=mid, retry_topic=T, real_topic=R, reconsume=1)
    done("dup-2")
    exp[(NS1, "dup-2")] = {"duplicate_absorbed"}
    # doubled: two deliveries, two effect rows
    b.msg(T, "dbl-1", next(o))
    b.msg(T, "dbl-1", next(o))
    done("dbl-1", effects=2)
    exp[(NS1, "dbl-1")] = {"doubled"}
    # lost: acknowledged, no record, no effect; and one through a committed retry copy
    b.msg(T, "lost-1", next(o))
    exp[(NS1, "lost-1")] = {"lost"}
    mid = b.msg(T, "lost-2", next(o))
    b.msg(R, "lost-2", 1, kind="retry", msg_id=mid, retry_topic=T, real_topic=R, reconsume=1)
    exp[(NS1, "lost-2")] = {"lost"}
    # effect missing: CONSUMED record, no effect row
    b.msg(T, "nofx-1", next(o))
    b.record(NS1, "nofx-1", "CONSUMED")
    exp[(NS1, "nofx-1")] = {"effect_missing"}
    # stuck: CONSUMING past its deadline, message not yet acknowledged (pending too)
    b.msg(T, "stuck-1", next(late))
    b.record(NS1, "stuck-1", "CONSUMING", deadline=PAST)
    exp[(NS1, "stuck-1")] = {"stuck", "pending"}
    # stuck and acknowledged: nothing will retry it (lost too)
    b.msg(T, "stuck-2", next(o))
    b.record(NS1, "stuck-2", "CONSUMING", deadline=PAST)
    exp[(NS1, "stuck-2")] = {"stuck", "lost"}
    # conflict: one key, two bodies (absorbed: one effect)
    b.msg(T, "cfl-1", next(o), body="a")
    b.msg(T, "cfl-1", next(o), body="b")
    done("cfl-1")
    exp[(NS1, "cfl-1")] = {"conflict", "duplicate_absorbed"}
    # dead-lettered: message, committed retry copy, DLQ copy; no record, no effect
    mid = b.msg(T, "dlq-1", next(o))
    b.msg(R, "dlq-1", 2, kind="retry", msg_id=mid, retry_topic=T, real_topic=R, reconsume=1)
    b.msg(D, "dlq-1", 0, kind="dlq", msg_id=mid, retry_topic=T, reconsume=2)
    exp[(NS1, "dlq-1")] = {"dead_lettered"}
    # record missing: an effect row, no dedup record
    b.msg(T, "norec-1", next(o))
    b.effect("norec-1")
    exp[(NS1, "norec-1")] = {"record_missing"}
    # orphans: records with no message in the window
    for k in ("orph-1", "orph-2"):
        done(k)
        exp[(NS1, k)] = {"orphan"}
    # pending: not acknowledged; and a retry still in the delay topic
    b.msg(T, "pend-1", next(late))
    exp[(NS1, "pend-1")] = {"pending"}
    mid = b.msg(T, "pend-2", next(o))
    b.msg(S, "pend-2", 1, kind="scheduled", msg_id=mid, retry_topic=T, real_topic=R, reconsume=1)
    exp[(NS1, "pend-2")] = {"pending"}
    # in progress: CONSUMING before its deadline, acknowledged → class "other"
    b.msg(T, "inprog-1", next(o))
    b.record(NS1, "inprog-1", "CONSUMING", deadline=FAR)
    exp[(NS1, "inprog-1")] = set()
    # long keys (255 characters): the SQL table stores their hash, Redis and the effect
    # table keep them as written; every side must meet as one key (ok)
    for letter, stored in (("L", "hash"), ("M", "raw")):
        long_key = letter * 255
        b.msg(T, long_key, next(o))
        b.record(NS1, "sha256:" + sha(long_key) if stored == "hash" else long_key, "CONSUMED")
        b.effect(long_key)
        exp[(NS1, "sha256:" + sha(long_key))] = {"ok"}
    # an effect row with no message and no record
    b.effect("ghost-1")
    exp[(NS1, "ghost-1")] = {"orphan_effect"}
    # stuck, acknowledged, but its copy went to the DLQ (a guard gave up on it): not lost,
    # an operator sees it there and can replay it
    b.msg(T, "stuck-dlq", next(o))
    b.msg(D, "stuck-dlq", 1, kind="dlq", retry_topic=T)
    b.record(NS1, "stuck-dlq", "CONSUMING", deadline=PAST)
    exp[(NS1, "stuck-dlq")] = {"stuck", "dead_lettered"}
    # unkeyed messages (2), counted, not classified
    b.msg(T, None, next(o))
    b.msg(T, None, next(o))
    # never attributed: other topic, half/op, invisible
    b.msg("unrelated", "x-1", 0)
    b.msg("RMQ_SYS_TRANS_HALF_TOPIC", "ok-1", 0, kind="half", real_topic=T)
    b.msg(T, "ok-1", next(o), visible=False)
    # a record in another namespace: out of scope
    b.record("g9/else", "zzz", "CONSUMED")

    # g2 on payments, no effects table
    for i, k in enumerate(("p-ok-1", "p-ok-2")):
        b.msg("payments", k, i, ts=DAY0 + 86_400_000 + 1)
        b.record(NS2, k, "CONSUMED")
        exp[(NS2, k)] = {"ok"}
    b.msg("payments", "p-lost-1", 2, ts=DAY0 + 86_400_000 + 1)
    exp[(NS2, "p-lost-1")] = {"lost"}
    b.msg("payments", "p-dup-1", 3, ts=DAY0 + 86_400_000 + 1)
    b.msg("payments", "p-dup-1", 4, ts=DAY0 + 86_400_000 + 1)
    b.record(NS2, "p-dup-1", "CONSUMED")
    exp[(NS2, "p-dup-1")] = {"duplicate_absorbed"}

    b.offsets = {"orders@g1": 100, "%RETRY%g1@g1": 10, "payments@g2": 100}
    return b, exp


CLASS_COUNTS = {
    "ok": 8,
    "duplicate_absorbed": 4,
    "doubled": 1,
    "lost": 4,
    "effect_missing": 1,
    "stuck": 3,
    "conflict": 1,
    "dead_lettered": 2,
    "record_missing": 1,
    "orphan": 2,
    "orphan_effect": 1,
    "pending": 3,
}


RECORDS_SCHEMA = pa.schema(
    [
        ("namespace", pa.string()),
        ("key", pa.string()),
        ("status", pa.string()),
        ("deadline", pa.int64()),
        ("expiry", pa.int64()),
        ("fingerprint", pa.string()),
        ("attempts", pa.int32()),
        ("owner", pa.string()),
        ("updated_at", pa.int64()),
    ]
)


def history_table(b: Builder) -> pa.Table:
    return pa.Table.from_pylist(b.rows, schema=arrow_schema())


def write(b: Builder, d: Path, fmt: str) -> dict[str, str]:
    """Write the dataset as Parquet or JSON lines; return the paths."""
    d.mkdir(parents=True, exist_ok=True)
    ext = "parquet" if fmt == "parquet" else "jsonl"
    paths = {n: str(d / f"{n}.{ext}") for n in ("history", "records", "effects")}
    tables = {
        "history": history_table(b),
        "records": pa.Table.from_pylist(b.records, schema=RECORDS_SCHEMA),
        "effects": pa.Table.from_pylist(b.effects),
    }
    for name, table in tables.items():
        if fmt == "parquet":
            pq.write_table(table, paths[name])
        else:
            with open(paths[name], "w") as fh:
                for row in table.to_pylist():
                    fh.write(json.dumps(row) + "\n")
    offsets = d / "consumerOffset.json"
    # RocketMQ's fastjson style: bare integer queue ids
    table = ",".join(f'"{tg}":{{0:{off}}}' for tg, off in b.offsets.items())
    offsets.write_text('{"offsetTable":{' + table + "}}")
    paths["offsets"] = str(offsets)
    return paths
