"""A decorated idemp listener on the official RocketMQ 5 client, in a child process.

Runs in ``.cache/v5-venv`` (idemp with the ``rocketmq5`` extra). Usage:

    python idemp5.py '{"mode": "simple"|"push", "endpoint": ..., "topic": ..., "group": ...,
                       "db": <sqlite path>, "keys": N, "lose_first": [...], "within": s,
                       "later_after": s, "invisible": s}'

The listener is ``@idempotent`` on the JSON field ``id`` with a transactional unique-key
table in SQLite; its effect is one row in ``effects`` (id, message group, seq). For the ids
in ``lose_first`` the first delivery's result is thrown away after the handler committed
(as if the consumer died before its ack): the broker hands the message out again and the
decorator must answer "duplicate"; with ``later_after`` that first result is
``ReconsumeLater(after=later_after)`` instead, and the JSON line says how long each of
those messages took to come back (``gaps``). The child stops once ``keys`` distinct ids have their
effect and every delivery so far was answered, and prints one JSON line of counts.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import sqlalchemy as sa
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    PushConsumer,
    SimpleConsumer,
)

from idemp import Context, Message, idempotent, stats
from idemp.adapters import rocketmq5
from idemp.message import ConsumeResult, ReconsumeLater, consume_result_of
from idemp.strategies import UniqueKeyTable


def main() -> None:
    spec: dict[str, Any] = json.loads(sys.argv[1])
    url = f"sqlite:///{spec['db']}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE TABLE IF NOT EXISTS effects"
                " (id TEXT, grp TEXT, seq INT, n INTEGER PRIMARY KEY)"
            )
        )
    lose = set(spec.get("lose_first", []))
    lost: set[str] = set()  # first result thrown away
    again: set[str] = set()  # ... and handed out again
    name = "effects5"

    @idempotent(key="json:$.id", strategy=UniqueKeyTable(url, transactional=True), name=name)
    def handle(message: Message, ctx: Context) -> None:
        body = message.json()
        ctx.connection.execute(
            sa.text("INSERT INTO effects (id, grp, seq) VALUES (:id, :grp, :seq)"),
            {"id": body["id"], "grp": message.message_group or "", "seq": body.get("seq", 0)},
        )

    later_after = spec.get("later_after")
    first_at: dict[str, float] = {}
    gaps: dict[str, float] = {}

    def listener(message: Message) -> Any:
        key = message.json()["id"]
        if key in lost and key not in again:
            again.add(key)
            gaps[key] = round(time.monotonic() - first_at[key], 2)
        result = consume_result_of(handle(message))
        if result is ConsumeResult.SUCCESS and key in lose and key not in lost:
            lost.add(key)
            first_at[key] = time.monotonic()
            if later_after is not None:
                return ReconsumeLater(after=later_after)
            return ConsumeResult.RECONSUME_LATER  # the ack is lost: it must come back
        return result

    def finished() -> bool:
        with engine.connect() as conn:
            done = conn.execute(sa.text("SELECT COUNT(DISTINCT id) FROM effects")).scalar_one()
        return done >= spec["keys"] and again == lose

    cfg = ClientConfiguration(spec["endpoint"], Credentials(), request_timeout=10)
    subs = {spec["topic"]: FilterExpression("*")}
    deadline = time.monotonic() + spec["within"]
    counts: dict[str, int] = {}  # the SimpleConsumer loop's, summed over its rounds
    if spec["mode"] == "push":
        consumer = PushConsumer(
            cfg, spec["group"], rocketmq5.listener(listener, group=spec["group"]), subs
        )
        consumer.startup()
        while not finished() and time.monotonic() < deadline:
            time.sleep(0.2)  # the push consumer works on its own threads; poll the result
        consumer.shutdown()
    else:
        consumer = SimpleConsumer(cfg, spec["group"], subs, 5)
        consumer.startup()
        stop = threading.Event()
        while not stop.is_set() and time.monotonic() < deadline:
            got = rocketmq5.consume(
                consumer,
                listener,
                group=spec["group"],
                invisible_duration=spec.get("invisible", 10),
                rounds=1,
            )
            for k, v in got.items():
                counts[k] = counts.get(k, 0) + v
            if finished():
                stop.set()
        consumer.shutdown()
    print(
        json.dumps({"stats": stats(name), "again": sorted(again), "counts": counts, "gaps": gaps}),
        flush=True,
    )


if __name__ == "__main__":
    main()
