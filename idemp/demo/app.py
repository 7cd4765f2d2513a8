"""The demo's consumers: decorated listeners and the runners that drive them.

Used by the demo process and by the worker child it kills (``idemp.demo.worker``).
Each event is one transition of one order. The listener is ``@guarded`` by the
ride-hailing state machine, with the dedup strategy around it (by default the SQLite
unique-key table in transactional mode: the dedup row, the order's new state and the
effect row commit in one transaction). The effect is a row in the effects table with
an auto-increment ``seq``, so the order in which transitions were applied can be
checked afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from idemp.guards import RIDE_HAILING_ORDER, SqlStateStore
from idemp.message import Message
from idemp.strategies.base import Strategy

DISPATCH_TOPIC = "RideDispatchEvents"  # concurrent
TRIPS_TOPIC = "RideTripEvents"  # orderly, sharding key = order id
DISPATCH_GROUP = "ride-dispatch"
TRIPS_GROUP = "ride-trips"
DISPATCH_CACHED = 64  # pull_threshold_for_queue of the concurrent runner (see below)
# Messages per consume batch, i.e. per transaction: a whole pull (32). At 8 (dispatch) and
# 16 (trips) the per-batch work (connection, BEGIN, claims, states read, COMMIT, a hand-off
# to a consume thread) cost the takeover ~20 % more CPU (docs/performance.md, "Demo").
BATCH = 32


@dataclass(frozen=True)
class Names:
    """Topic, group and table names of one run (suffixed when the stores are shared)."""

    suffix: str = ""

    def _s(self, base: str, sep: str = "-") -> str:
        return f"{base}{sep}{self.suffix}" if self.suffix else base

    @property
    def dispatch_topic(self) -> str:
        return self._s(DISPATCH_TOPIC, "_")

    @property
    def trips_topic(self) -> str:
        return self._s(TRIPS_TOPIC, "_")

    @property
    def dispatch_group(self) -> str:
        return self._s(DISPATCH_GROUP)

    @property
    def trips_group(self) -> str:
        return self._s(TRIPS_GROUP)

    @property
    def effects_table(self) -> str:
        return self._s("demo_ride_effects", "_")

    @property
    def state_table(self) -> str:
        return self._s("demo_ride_state", "_")


def effects_table(name: str) -> sa.Table:
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_key", sa.String(255), nullable=False),
        sa.Column("order_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(64), nullable=False),
        sa.Column("topic", sa.String(128), nullable=False),
        sa.Column("msg_id", sa.String(64), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("fare_cents", sa.Integer, nullable=False),
    )


def make_strategy(db_url: str, dedup_url: str | None) -> Strategy:
    """The dedup strategy: a Redis flag when ``dedup_url`` is ``redis://…``, else the
    unique-key table on ``dedup_url`` (default: the database itself), transactional."""
    from idemp.strategies import RedisFlag, UniqueKeyTable

    # The processing deadline must end well inside the retry window, or a message whose
    # claim a killed consumer left CONSUMING is retried as "in progress" until it is
    # dead-lettered: the demo's 1 s delay levels give 16 retries ~16 s (RocketMQ's
    # defaults: ~4 h 46 min). Transactional SQL leaves no such claim (it rolls back).
    url = dedup_url or db_url
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisFlag(url, deadline_s=5.0)
    return UniqueKeyTable(url, transactional=True, deadline_s=5.0, lock_timeout_s=10.0)


class Consumers:
    """Both decorated listeners and their runners, for one process."""

    def __init__(
        self,
        namesrv: str,
        db_url: str,
        dedup_url: str | None,
        names: Names,
        *,
        lock_expiry_s: float = 30.0,
        threads: int = 4,
    ) -> None:
        from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings
        from idemp.pipeline import IdempotentListener, guarded
        from idemp.runners import ConcurrentRunner, OrderlyRunner

        # The poison message fails on every delivery: its tracebacks would bury the
        # output. The counters (idemp.stats) report every outcome; errors still log.
        logging.getLogger("idemp").setLevel(logging.ERROR)
        self.names = names
        self.strategy = make_strategy(db_url, dedup_url)
        self.states = SqlStateStore(db_url, table=names.state_table, lock_timeout_s=10.0)
        self.table = effects_table(names.effects_table)
        self.table.metadata.create_all(self.states.engine, checkfirst=True)
        self.pid = os.getpid()
        self.poison_attempts = 0
        self._lock = threading.Lock()
        pid = self.pid
        insert = self.table.insert()  # built once: building it per call cost ~5 % CPU

        def apply(message: Message, ctx: Any) -> None:
            event = json.loads(message.body)
            fare_cents = round(float(event["fare"]) * 100)  # the poison message fails here
            row = {
                "event_key": message.key,
                "order_id": event["order"],
                "state": event["state"],
                "topic": message.topic,
                "msg_id": message.msg_id,
                "pid": pid,
                "fare_cents": fare_cents,
            }
            ctx.connection.execute(insert, row)

        def listener(group: str, name: str) -> Any:
            wrapped = guarded(
                RIDE_HAILING_ORDER,
                entity="json:$.order",
                target="json:$.state",
                store=self.states,
                strategy=self.strategy,
                key="keys",
                group=group,
                max_holds=16,
                after_holds="reconsume",
                name=name,
                pass_context=True,
            )(apply)
            assert isinstance(wrapped, IdempotentListener)  # apply is not async

            def poisoned(messages: Any) -> int:
                return sum(
                    1 for m in messages if m.key is not None and m.key.startswith("order-poison")
                )

            def consume(message: Message) -> Any:
                if poisoned([message]):
                    with self._lock:
                        self.poison_attempts += 1
                return wrapped(message)

            def consume_batch(messages: Any, **options: Any) -> Any:
                # the runner's batch in one transaction (idemp.pipeline consume_batch)
                results = wrapped.consume_batch(messages, **options)
                tried = poisoned(messages[: len(results)])
                if tried:
                    with self._lock:
                        self.poison_attempts += tried
                return results

            consume.consume_batch = consume_batch  # type: ignore[attr-defined]
            return consume

        # Short lock intervals so that queues of a killed process move on in seconds
        # (the broker side is set by rebalanceLockMaxLiveTime, see idemp.demo.run).
        renew = max(0.5, lock_expiry_s / 3)
        client = ClientSettings(
            namesrv_addr=namesrv,
            rebalance_interval=2.0,
            persist_offset_interval=1.0,
        )

        def settings(
            group: str, batch: int, max_reconsume: int, cached: int = 1000
        ) -> ConsumerSettings:
            return ConsumerSettings(
                pull_threshold_for_queue=cached,
                max_reconsume_times=max_reconsume,
                group=group,
                consume_from=ConsumeFrom.FIRST_OFFSET,
                consume_thread_count=threads,
                consume_batch_size=batch,
                lock_renew_interval=renew,
                lock_expiry=lock_expiry_s,
                suspend_current_queue_time=0.2,
            )

        self.dispatch = ConcurrentRunner(
            listener(names.dispatch_group, "dispatch"),
            # The poison: DLQ after 16. Few messages cached per queue: a retried message
            # (the poison, a held transition) queues behind every cached one. With the
            # default 1,000 per queue the poison's 17 deliveries outlasted the rest of the
            # consumption by ~11 s at 10,000 orders; with 64 they end before it.
            settings=settings(names.dispatch_group, BATCH, 16, cached=DISPATCH_CACHED),
            client=client,
        )
        self.dispatch.subscribe(names.dispatch_topic)
        self.trips = OrderlyRunner(
            listener(names.trips_group, "trips"),
            # Orderly retries are in memory, 0.2 s apart: 16 would dead-letter a message
            # that waits out a dead consumer's claim. -1 = forever (Java's orderly default).
            settings=settings(names.trips_group, BATCH, -1),
            client=client,
        )
        self.trips.subscribe(names.trips_topic)

    def start(self) -> None:
        self.dispatch.start(timeout=30)
        self.trips.start(timeout=30)

    def shutdown(self) -> None:
        try:
            self.dispatch.shutdown(60)
            self.trips.shutdown(60)
        finally:
            self.strategy.close()
            self.states.close()
