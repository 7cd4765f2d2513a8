"""End to end: idemp's broker, a decorated consumer with duplicates injected, export,
reconcile → clean; then one effect row and one dedup row deleted by hand → found."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from idemp.reconcile.cli import main as reconcile
from idemp.reconcile.loaders import export_sql_table
from tests.realbroker import broker_of

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ORDERS = 30
DUPLICATED = 8  # orders 0..7 are sent twice (a producer retry: new msgId, same key)
FAIL_ONCE = {"order-20", "order-21"}  # their first delivery fails: redelivered via %RETRY%


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_broker_consumer_export_reconcile(spark: Any, tmp_path: Path) -> None:
    from idemp import Message, idempotent
    from idemp.broker.export import export
    from idemp.client import (
        ClientSettings,
        ConsumeFrom,
        ConsumerSettings,
        OutMessage,
        Producer,
        ProducerSettings,
    )
    from idemp.runners import ConcurrentRunner
    from idemp.strategies.unique_key import UniqueKeyTable

    store = tmp_path / "store"
    url = f"sqlite:///{tmp_path / 'app.db'}"
    engine = sa.create_engine(url)
    points = sa.Table(
        "points",
        sa.MetaData(),
        sa.Column("order_id", sa.String(64)),
        sa.Column("points", sa.Integer),
    )
    points.metadata.create_all(engine)
    strategy = UniqueKeyTable(url, transactional=True)
    failed: set[str] = set()

    @idempotent(key="keys", strategy=strategy, group="g1")
    def handle(msg: Message, ctx: Any) -> None:
        key = msg.key
        assert key is not None
        if key in FAIL_ONCE and key not in failed:
            failed.add(key)
            raise RuntimeError("first delivery fails")
        # ctx.handle: the strategy's SQLAlchemy connection (its transaction commits the
        # dedup row too). ctx.connection returns the raw DBAPI connection here.
        ctx.handle.execute(points.insert().values(order_id=key, points=10))

    def count(sql: str) -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(sql)).scalar_one())

    # short delay levels, so a redelivery comes back in a second
    props = {"messageDelayLevel": " ".join(["1s"] * 18), "flushConsumerOffsetInterval": "500"}
    with broker_of(store, props, HERE) as broker:
        client = ClientSettings(
            namesrv_addr=broker.namesrv_addr, persist_offset_interval=0.5, rebalance_interval=1.0
        )
        producer = Producer(settings=ProducerSettings(group="p1"), client=client)
        producer.start()
        try:
            for i in list(range(ORDERS)) + list(range(DUPLICATED)):
                body = json.dumps({"order": i, "points": 10}).encode()
                producer.send(OutMessage("orders", body, keys=[f"order-{i}"]))
        finally:
            producer.shutdown()
        runner = ConcurrentRunner(
            handle,
            settings=ConsumerSettings(group="g1", consume_from=ConsumeFrom.FIRST_OFFSET),
            client=client,
        )
        runner.subscribe("orders", "*")
        runner.start(timeout=30)
        try:
            _wait(lambda: count("select count(*) from points") == ORDERS, 60, "every effect")
            _wait(lambda: failed == FAIL_ONCE, 10, "the failures")
        finally:
            runner.shutdown()
        time.sleep(1.0)  # the broker flushes consumerOffset.json every 500 ms; stop() too
    strategy.close()

    export(store, tmp_path / "history.parquet")
    offsets = store / "config" / "consumerOffset.json"

    def run(out: Path) -> dict[str, Any]:
        export_sql_table(url, "idemp_dedup", tmp_path / "records.parquet")
        export_sql_table(url, "points", tmp_path / "points.parquet")
        code = reconcile(
            [
                "--history",
                str(tmp_path / "history.parquet"),
                "--records",
                str(tmp_path / "records.parquet"),
                "--effects",
                f"{tmp_path / 'points.parquet'}:order_id",
                "--offsets",
                str(offsets),
                "--subscription",
                "orders@g1",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
        summary["exit_code"] = code
        return summary

    clean = run(tmp_path / "clean")
    c = clean["counts"]
    assert clean["exit_code"] == 0
    assert c["keys"] == ORDERS
    assert c["messages"] == ORDERS + DUPLICATED
    assert c["deliveries"] == ORDERS + DUPLICATED + len(FAIL_ONCE)
    assert c["ok"] == ORDERS - DUPLICATED - len(FAIL_ONCE)
    assert c["duplicate_absorbed"] == DUPLICATED + len(FAIL_ONCE)
    assert {k: c[k] for k in clean["thresholds"]} == dict.fromkeys(clean["thresholds"], 0)
    for name in (
        "conflict",
        "dead_lettered",
        "record_missing",
        "orphan",
        "orphan_effect",
        "pending",
    ):
        assert c[name] == 0, name

    with engine.begin() as conn:
        conn.execute(sa.text("delete from points where order_id = 'order-5'"))
        conn.execute(sa.text("delete from idemp_dedup where business_key = 'order-12'"))
    broken = run(tmp_path / "broken")
    assert broken["exit_code"] == 1
    assert broken["failed"] == {"effect_missing": 1}
    b = broken["counts"]
    assert (b["effect_missing"], b["record_missing"]) == (1, 1)
    assert b["ok"] == c["ok"] - 1  # order-12 (order-5 was a duplicate: absorbed → missing)
    assert b["duplicate_absorbed"] == c["duplicate_absorbed"] - 1
    disc = spark.read.parquet(str(tmp_path / "broken" / "discrepancies"))
    got = sorted((r["discrepancy"], r["key"]) for r in disc.collect())
    assert got == [("effect_missing", "order-5"), ("record_missing", "order-12")]
