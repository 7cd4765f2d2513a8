"""Loyalty points keyed by order id: the business table is its own idempotency record.

``t_points`` has a UNIQUE ``order_id``; the listener inserts one row per completed order
and the insert of a second row for the same order fails on the constraint. Wrapped in
``@idempotent`` with a unique-key table (transactional: the dedup row and the points row
commit together), a redelivery is absorbed before the handler runs, and the constraint
remains the last line of defence.

    python examples/loyalty_points.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import sqlalchemy as sa
from _embedded import broker, producer, send, settings, wait_until

from idemp import Context, Message, idempotent, stats
from idemp.runners import ConcurrentRunner
from idemp.strategies import UniqueKeyTable

TOPIC, GROUP = "OrderCompleted", "loyalty"
ORDERS = 25
points = sa.Table(
    "t_points",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.String(64), nullable=False, unique=True),
    sa.Column("user_id", sa.String(64), nullable=False),
    sa.Column("points", sa.Integer, nullable=False),
)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, broker() as namesrv:
        url = f"sqlite:///{Path(tmp) / 'loyalty.db'}"
        engine = sa.create_engine(url)
        points.metadata.create_all(engine)
        strategy = UniqueKeyTable(url, transactional=True)

        @idempotent(key="json:$.order_id", strategy=strategy, name="loyalty")
        def award(message: Message, ctx: Context) -> None:
            order = message.json()
            ctx.connection.execute(
                points.insert().values(
                    order_id=order["order_id"],
                    user_id=order["user"],
                    points=order["amount_cents"] // 100,
                )
            )

        p = producer(namesrv)
        for i in range(ORDERS):
            body = json.dumps({"order_id": f"ord-{i}", "user": f"u{i % 3}", "amount_cents": 4200})
            for _ in range(2 if i % 4 == 0 else 1):  # producer retries: same order id
                send(p, TOPIC, body, f"ord-{i}")
        p.shutdown()

        def rows() -> int:
            with engine.connect() as conn:
                return int(
                    conn.execute(sa.select(sa.func.count()).select_from(points)).scalar_one()
                )

        consumer, client = settings(namesrv, GROUP)
        runner = ConcurrentRunner(award, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_until(
                lambda: rows() == ORDERS and stats("loyalty")["duplicates"] == 7,
                60,
                "every order's points and the 7 retries",
            )
        finally:
            runner.shutdown()
            strategy.close()
        with engine.connect() as conn:
            total = conn.execute(sa.select(sa.func.sum(points.c.points))).scalar_one()
        c = stats("loyalty")
        print(
            f"t_points rows {rows()} for {ORDERS} orders, {total} points; "
            f"processed {c['processed']}, duplicates absorbed {c['duplicates']}"
        )
        return 0 if rows() == ORDERS and total == ORDERS * 42 else 1


if __name__ == "__main__":
    raise SystemExit(main())
