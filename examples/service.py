"""A service's listeners declared on an App, run by ``idemp worker``.

Two listeners: ``on_order`` (concurrent, 4 threads, keyed by the body's ``order_id``)
and ``on_ride_step`` (orderly: one ride's steps in queue order). Their dedup backend is
configuration: ``IDEMP_BACKEND`` (default ``sqlite:///idemp.db``), or per listener
``IDEMP_LISTENERS__on_order__BACKEND=postgresql+psycopg://…``. Effects go to
``EFFECTS_URL`` (default ``sqlite:///effects.db``), one row per handler run, so a doubled
effect would show as two rows.

    cd examples && IDEMP_NAMESRV=127.0.0.1:9876 idemp worker service:app --http-port 8000

``python examples/service.py`` runs it all on an embedded broker: sends orders (some
twice, as a producer retry would) and ride steps, runs the app, stops it, prints counts.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from idemp import App, Message
from idemp.client import ConsumeFrom

effects = sa.MetaData()
orders = sa.Table(
    "svc_orders",
    effects,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.String(64), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)
ride_steps = sa.Table(
    "svc_ride_steps",
    effects,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("ride", sa.String(64), nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
)
_engine_lock = threading.Lock()


@functools.cache
def _engine(url: str) -> sa.Engine:
    engine = sa.create_engine(url)
    effects.create_all(engine)
    return engine


def db() -> sa.Engine:
    """The effects database, from the environment at first use (the worker's); the
    listeners' threads share one engine, created once."""
    with _engine_lock:
        return _engine(os.environ.get("EFFECTS_URL", "sqlite:///effects.db"))


# Seconds each order takes (to see in-flight work finish on SIGTERM); 0 by default.
ORDER_WORK_S = float(os.environ.get("ORDER_WORK_S", "0"))

app = App("orders-service")


@app.listener(
    "SvcOrders",
    group="svc-orders",
    key="json:order_id",
    threads=4,
    consume_from=ConsumeFrom.FIRST_OFFSET,
)
def on_order(message: Message) -> None:
    time.sleep(ORDER_WORK_S)
    order_id = json.loads(message.body)["order_id"]
    with db().begin() as conn:
        conn.execute(sa.insert(orders), {"order_id": order_id, "pid": os.getpid()})


@app.listener(
    "SvcRides",
    group="svc-rides",
    orderly=True,
    key="json:step_id",
    consume_from=ConsumeFrom.FIRST_OFFSET,
)
def on_ride_step(message: Message) -> None:
    data = json.loads(message.body)
    with db().begin() as conn:
        conn.execute(sa.insert(ride_steps), {"ride": data["ride"], "step": data["step"]})


def main() -> int:
    from _embedded import broker, producer, send, wait_until

    tmp = Path(tempfile.mkdtemp(prefix="idemp-service-"))
    os.environ.setdefault("IDEMP_BACKEND", f"sqlite:///{tmp / 'dedup.db'}")
    os.environ.setdefault("EFFECTS_URL", f"sqlite:///{tmp / 'effects.db'}")
    with broker() as namesrv:
        p = producer(namesrv)
        for i in range(30):
            body = json.dumps({"order_id": f"o-{i}"})
            send(p, "SvcOrders", body, f"o-{i}")
            if i % 10 == 0:  # a producer retry: same order, new msgId
                send(p, "SvcOrders", body, f"o-{i}")
        for ride in range(4):
            for step in range(5):
                body = json.dumps({"ride": f"r{ride}", "step": step, "step_id": f"r{ride}.{step}"})
                send(p, "SvcRides", body, f"r{ride}.{step}", sharding_key=f"r{ride}")
        p.shutdown()
        app._namesrv = namesrv  # what --namesrv / IDEMP_NAMESRV set for the worker
        app.start()

        def count(table: sa.Table) -> int:
            with db().connect() as conn:
                return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())

        try:
            wait_until(lambda: count(orders) >= 30 and count(ride_steps) >= 20, 60, "effects")
        finally:
            app.stop()
        with db().connect() as conn:
            per_order = conn.execute(
                sa.select(orders.c.order_id, sa.func.count()).group_by(orders.c.order_id)
            ).all()
            steps = conn.execute(sa.select(ride_steps.c.ride, ride_steps.c.step)).all()
        in_order = all(
            [s for r, s in steps if r == ride] == list(range(5))
            for ride in ("r0", "r1", "r2", "r3")
        )
        once = all(n == 1 for _, n in per_order)
        print(
            f"orders {len(per_order)}, each once: {once}; ride steps {len(steps)}, "
            f"each ride in order: {in_order}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
