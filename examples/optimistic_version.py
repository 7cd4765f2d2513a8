"""Optimistic version update of an order.

Each ``OrderStatusChanged`` message says which version of the order it was built
against. The update applies only to that version (``UPDATE … SET …, version = version + 1
WHERE id = :id AND version = :v``): a redelivery or a producer retry finds the version
moved on and is dropped as stale; a message ahead of its predecessor (the row still at
a lower version) comes back later. Nothing is locked while the handler runs.

    python examples/optimistic_version.py   (DATABASE_URL=postgresql+psycopg://… for PostgreSQL)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import sqlalchemy as sa
from _embedded import broker, database_url, producer, send, settings, wait_until

from idemp import Context, Message, idempotent, stats
from idemp.runners import ConcurrentRunner
from idemp.strategies import OptimisticVersion

TOPIC, GROUP = "OrderStatusChanged", "order-status"
STEPS = ["paid", "shipped", "delivered"]  # built against versions 1, 2, 3
ORDERS = 8


def main() -> int:
    with (
        tempfile.TemporaryDirectory() as tmp,
        database_url(Path(tmp) / "orders.db") as url,
        broker() as namesrv,
    ):
        strategy = OptimisticVersion(
            url,
            table="t_order",
            on_conflict="drop",
            expected_version=lambda m: int(m.json()["version"]),
            entity_id=lambda job: job.message.json()["order"],
        )
        with strategy.engine.begin() as conn:  # the orders exist at version 1 ("created")
            conn.execute(sa.delete(strategy.table))
            conn.execute(
                sa.insert(strategy.table),
                [{"id": f"o-{i}", "version": 1, "state": "created"} for i in range(ORDERS)],
            )

        @idempotent(key="keys", strategy=strategy, name="order-status")
        def on_status(message: Message, ctx: Context) -> None:
            ctx.handle.update(state=message.json()["state"])  # VersionConflict if raced

        p = producer(namesrv)
        for i in range(ORDERS):
            steps = list(enumerate(STEPS, start=1))
            if i % 3 == 0:
                steps[0], steps[1] = steps[1], steps[0]  # "shipped" sent before "paid"
            steps.append(steps[0])  # and one repeated
            for version, state in steps:
                body = json.dumps({"order": f"o-{i}", "state": state, "version": version})
                send(p, TOPIC, body, f"o-{i}@{version}")
        p.shutdown()

        def states() -> dict[str, tuple[str, int]]:
            with strategy.engine.connect() as conn:
                t = strategy.table
                return {r.id: (r.state, r.version) for r in conn.execute(sa.select(t))}

        consumer, client = settings(namesrv, GROUP)
        runner = ConcurrentRunner(on_status, settings=consumer, client=client)
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_until(
                lambda: (
                    set(states().values()) == {("delivered", 4)}
                    and stats("order-status")["guard_drops"] == ORDERS
                ),
                90,
                "every order delivered at version 4",
            )
        finally:
            runner.shutdown()
        final = states()
        strategy.close()
    c = stats("order-status")
    print(
        f"orders {sorted(set(final.values()))}; updates {c['processed']}, stale dropped "
        f"{c['guard_drops']}, ahead (came back later) {c['in_progress']}"
    )
    return 0 if c["processed"] == ORDERS * len(STEPS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
