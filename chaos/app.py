"""The chaos consumers: three decorated listeners, one runner each, in one process.

Every effect is a row of ``chaos_effects`` (an append-only log with a serial id, so a
doubled effect shows as two rows and the order of application can be read back),
written in the same PostgreSQL transaction as what makes it idempotent.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from chaos.scenario import (
    PAY_GROUP,
    PAY_TOPIC,
    RIDES_GROUP,
    RIDES_TOPIC,
    SEQ_GROUP,
    SEQ_TOPIC,
)
from idemp.message import Message

METADATA = sa.MetaData()
EFFECTS = sa.Table(
    "chaos_effects",
    METADATA,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("topic", sa.String(64), nullable=False),
    sa.Column("key", sa.String(128), nullable=False),
    sa.Column("entity", sa.String(64), nullable=False),
    sa.Column("n", sa.Integer, nullable=False),  # stream event number / ride state index
    sa.Column("gap", sa.Boolean, nullable=False, default=False),  # applied ahead of n-1
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("msg_id", sa.String(64), nullable=False),
)
CURSORS = sa.Table(
    "chaos_cursors",
    METADATA,
    sa.Column("stream", sa.String(64), primary_key=True),
    sa.Column("last", sa.Integer, nullable=False),
)
DEDUP_TABLE = "chaos_dedup"
RIDE_VERSIONS = "chaos_ride_versions"
RIDE_STATE = "chaos_ride_state"
REDIS_PREFIX = "chaos"


def record_payment(conn: sa.Connection, topic: str, message: Message, pid: int) -> None:
    """A payment's effect: one row, in the transaction of the claim that dedups it."""
    conn.execute(
        EFFECTS.insert().values(
            topic=topic,
            key=message.key,
            entity=json.loads(message.body)["id"],
            n=0,
            gap=False,
            pid=pid,
            msg_id=message.msg_id,
        )
    )


def create_schema(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    try:
        METADATA.create_all(engine, checkfirst=True)
    finally:
        engine.dispose()


def apply_in_sequence(engine: sa.Engine, message: Message, pid: int, topic: str) -> bool:
    """Apply one message of a sequence (body ``{"stream", "n"}``): the stream's cursor and
    the effect row (under ``topic``) in one transaction. False if the cursor shows it
    applied already (the flag did not know: a crash, a flag lost or expired)."""
    body = json.loads(message.body)
    stream, n = body["stream"], int(body["n"])
    with engine.begin() as conn:
        conn.execute(pg_insert(CURSORS).values(stream=stream, last=-1).on_conflict_do_nothing())
        last = conn.execute(
            sa.select(CURSORS.c.last).where(CURSORS.c.stream == stream).with_for_update()
        ).scalar_one()
        if n <= last:
            return False
        conn.execute(sa.update(CURSORS).where(CURSORS.c.stream == stream).values(last=n))
        conn.execute(
            EFFECTS.insert().values(
                topic=topic,
                key=message.key,
                entity=stream,
                n=n,
                gap=n != last + 1,
                pid=pid,
                msg_id=message.msg_id,
            )
        )
    return True


class Consumers:
    """The three runners of one consumer process."""

    def __init__(self, namesrv: str, pg_url: str, redis_url: str, *, threads: int = 4) -> None:
        from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings
        from idemp.guards import RIDE_HAILING_ORDER, SqlStateStore
        from idemp.pipeline import guarded, idempotent
        from idemp.runners import ConcurrentRunner, OrderlyRunner
        from idemp.strategies import OptimisticVersion, RedisFlag, UniqueKeyTable

        # Store outages make every listener log; the counters (idemp.stats) tell the story.
        logging.getLogger("idemp").setLevel(logging.CRITICAL)
        self.pid = pid = os.getpid()
        self.engine = sa.create_engine(
            pg_url, pool_size=threads, max_overflow=threads, pool_pre_ping=True
        )
        self.uk = UniqueKeyTable(
            pg_url, table=DEDUP_TABLE, transactional=True, deadline_s=5.0, lock_timeout_s=5.0
        )
        self.flag = RedisFlag(redis_url, prefix=REDIS_PREFIX, deadline_s=5.0, socket_timeout_s=3.0)
        self.version = OptimisticVersion(
            pg_url,
            table=RIDE_VERSIONS,
            entity_id=lambda job: json.loads(job.message.body)["order"],
            max_retries=5,
        )
        self.states = SqlStateStore(pg_url, table=RIDE_STATE, lock_timeout_s=5.0)
        self.cursor_repeats = 0
        engine = self.engine

        @idempotent(key="keys", strategy=self.uk, name="pay")
        def pay(message: Message, ctx: Any) -> None:
            record_payment(ctx.connection, PAY_TOPIC, message, pid)

        @idempotent(key="keys", strategy=self.flag, name="seq")
        def seq(message: Message) -> None:
            if not apply_in_sequence(engine, message, pid, SEQ_TOPIC):
                self.cursor_repeats += 1

        @guarded(
            RIDE_HAILING_ORDER,
            entity="json:$.order",
            target="json:$.state",
            store=self.states,
            strategy=self.version,
            key="keys",
            max_holds=16,
            after_holds="reconsume",
            name="rides",
            pass_context=True,
        )
        def rides(message: Message, ctx: Any) -> None:
            from chaos.scenario import RIDE_STATES

            body = json.loads(message.body)
            handle = ctx.handle  # idemp.strategies.optimistic.Versioned
            if handle.version is None:
                handle.insert(state=body["state"])
            else:
                handle.update(state=body["state"])
            ctx.connection.execute(
                EFFECTS.insert().values(
                    topic=RIDES_TOPIC,
                    key=message.key,
                    entity=body["order"],
                    n=RIDE_STATES.index(body["state"]),
                    gap=False,
                    pid=pid,
                    msg_id=message.msg_id,
                )
            )

        client = ClientSettings(
            namesrv_addr=namesrv,
            rebalance_interval=2.0,
            persist_offset_interval=1.0,
            heartbeat_interval=5.0,
            route_refresh_interval=5.0,
        )

        def settings(group: str, orderly: bool, batch: int) -> ConsumerSettings:
            return ConsumerSettings(
                group=group,
                consume_from=ConsumeFrom.FIRST_OFFSET,
                consume_thread_count=threads,
                consume_batch_size=batch,
                # Never dead-letter: a message held back by a store outage or an
                # unexpired claim must come back, however long the chaos lasts.
                max_reconsume_times=-1 if orderly else 10_000,
                lock_renew_interval=0.6,
                lock_expiry=1.8,  # the broker's is 3 s (rebalanceLockMaxLiveTime)
                suspend_current_queue_time=0.2,
                pull_time_delay_when_exception=0.5,
                send_back_retry_delay=1.0,
            )

        self.runners: list[Any] = []
        # rides in batches of 8: @guarded's batch path (one transaction, states preloaded,
        # holds retried inside the batch) under the same kills and store restarts
        for fn, topic, group, orderly, batch in (
            (pay, PAY_TOPIC, PAY_GROUP, False, 1),
            (seq, SEQ_TOPIC, SEQ_GROUP, True, 8),
            (rides, RIDES_TOPIC, RIDES_GROUP, False, 8),
        ):
            cls = OrderlyRunner if orderly else ConcurrentRunner
            runner = cls(fn, settings=settings(group, orderly, batch), client=client)
            runner.subscribe(topic)
            self.runners.append(runner)

    def start(self) -> None:
        for runner in self.runners:
            runner.start(timeout=60)

    def shutdown(self) -> None:
        try:
            for runner in self.runners:
                runner.shutdown(30)
        finally:
            for closer in (self.uk, self.flag, self.version, self.states):
                closer.close()
            self.engine.dispose()
