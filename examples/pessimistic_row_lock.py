"""Pessimistic ``SELECT … FOR UPDATE`` update of an order's stock reservation.

Many ``ReserveStock`` messages hit the same SKU row from 8 consumer threads. The strategy
locks the row (``SELECT … FOR UPDATE``, bounded by a lock timeout → reconsume later) in
the transaction the handler writes in; under the lock the handler checks whether this
order already reserved (a redelivery) before it decrements the stock. The row lock
serializes; the check under it makes the effect happen once.

Runs on PostgreSQL (DATABASE_URL, or a throwaway server from pgserver's binaries):
SQLite has no row locks (the strategy falls back to BEGIN IMMEDIATE and says so).

    python examples/pessimistic_row_lock.py
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from _embedded import broker, database_url, producer, send, settings, wait_until

from idemp import Context, Message, idempotent, stats
from idemp.runners import ConcurrentRunner
from idemp.strategies import PessimisticRowLock

TOPIC, GROUP = "ReserveStock", "stock"
ORDERS, STOCK = 30, 100
meta = sa.MetaData()
stock = sa.Table(
    "t_stock",
    meta,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("qty", sa.Integer, nullable=False, server_default="0"),
)
reservations = sa.Table(
    "t_reservation",
    meta,
    sa.Column("order_id", sa.String(32), primary_key=True),
    sa.Column("sku", sa.String(32), nullable=False),
)


def main() -> int:
    with database_url() as url, broker() as namesrv:
        engine = sa.create_engine(url)
        meta.drop_all(engine)
        meta.create_all(engine)
        with engine.begin() as conn:
            conn.execute(stock.insert().values(id="sku-1", qty=STOCK))
        strategy = PessimisticRowLock(
            engine,
            table="t_stock",
            lock_timeout_s=5,
            entity_id=lambda job: job.message.json()["sku"],
        )

        @idempotent(key="json:$.order", strategy=strategy, name="stock")
        def reserve(message: Message, ctx: Context) -> None:
            r = message.json()
            conn = ctx.connection  # holds the row lock until the pipeline commits
            seen = conn.execute(
                sa.select(reservations.c.order_id).where(reservations.c.order_id == r["order"])
            ).first()
            if seen is not None:
                return  # a redelivery: already reserved under an earlier lock
            conn.execute(reservations.insert().values(order_id=r["order"], sku=r["sku"]))
            ctx.handle.update(qty=ctx.handle.row["qty"] - 1)

        p = producer(namesrv)
        for i in range(ORDERS):
            body = json.dumps({"order": f"ord-{i}", "sku": "sku-1"})
            for _ in range(2 if i % 5 == 0 else 1):
                send(p, TOPIC, body, f"ord-{i}")
        p.shutdown()

        def reserved() -> int:
            with engine.connect() as conn:
                return int(
                    conn.execute(sa.select(sa.func.count()).select_from(reservations)).scalar_one()
                )

        consumer, client = settings(namesrv, GROUP)
        consumer.consume_thread_count = 8
        runner = ConcurrentRunner(reserve, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_until(
                lambda: (
                    reserved() == ORDERS and stats("stock")["processed"] == ORDERS + ORDERS // 5
                ),
                90,
                "every reservation and redelivery",
            )
        finally:
            runner.shutdown()
        with engine.connect() as conn:
            left = conn.execute(sa.select(stock.c.qty)).scalar_one()
        strategy.close()
        engine.dispose()
    c = stats("stock")
    print(
        f"{ORDERS} orders reserved once each, stock left {left} "
        f"(expected {STOCK - ORDERS}); handler runs {c['processed']}, "
        f"lock waits that came back later {c['in_progress']}"
    )
    return 0 if left == STOCK - ORDERS else 1


if __name__ == "__main__":
    raise SystemExit(main())
