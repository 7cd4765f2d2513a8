"""A runner's batch on PessimisticRowLock and OptimisticVersion (``consume_batch``): one
transaction per batch, the batch's rows read (and locked) in one statement, a savepoint
per message; per-message outcomes as if alone, on real SQLite and PostgreSQL."""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from idemp import Context, Message, Outcome, ack_of, idempotent, stats
from idemp.outcome import Result
from idemp.strategies import Locked, OptimisticVersion, PessimisticRowLock, Strategy, Versioned

NS = "g/Orders"
DBS = ("sqlite", "pg")


def msg(key: str) -> Message:
    return Message("Orders", b"{}", keys=(key,), msg_id=uuid.uuid4().hex)


def outcomes(results: list[Any]) -> list[Any]:
    return [r.outcome if isinstance(r, Result) else r for r in results]


@pytest.fixture
def made() -> Iterator[list[Any]]:
    things: list[Any] = []
    yield things
    for thing in things:
        if isinstance(thing, Strategy):
            thing.close()
        else:
            thing.dispose()


def _table() -> str:
    return f"ent_{uuid.uuid4().hex[:10]}"


def _effects(engine: sa.Engine, name: str) -> sa.Table:
    table = sa.Table(
        f"{name}_fx",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("entity", sa.String(64)),
    )
    table.metadata.create_all(engine)
    return table


def _counts(engine: sa.Engine, effects: sa.Table) -> dict[str, int]:
    with engine.connect() as conn:
        query = sa.select(effects.c.entity, sa.func.count()).group_by(effects.c.entity)
        return {entity: int(n) for entity, n in conn.execute(query).all()}


def _states(engine: sa.Engine, table: str) -> dict[str, tuple[int, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT id, version, state FROM {table}")).all()
    return {r[0]: (int(r[1]), r[2]) for r in rows}


@pytest.mark.parametrize("db", DBS)
def test_pessimistic_batch_decides_each_message_as_if_alone(
    db: str, sql_url: Any, made: list[Any]
) -> None:
    """Check-then-act under the lock: a second copy of an entity in the same batch sees
    the first copy's writes; a failing handler undoes only its own; nothing of the batch
    is visible to another reader before its COMMIT."""
    url, table = sql_url(db), _table()
    strategy = PessimisticRowLock(url, table=table, lock_timeout_s=0.5)
    made.append(strategy)
    effects = _effects(strategy.engine, table)
    reader = sa.create_engine(url)
    made.append(reader)
    during: dict[str, Any] = {}
    name = f"pess-batch-{db}"

    @idempotent(key="keys", strategy=strategy, namespace=NS, name=name)
    def handle(message: Message, ctx: Context) -> None:
        locked: Locked = ctx.handle
        assert locked.row is not None  # created under the lock when missing
        if locked.row["state"] == "done":
            return  # the duplicate: what the row says under the lock
        ctx.connection.execute(sa.insert(effects), {"entity": locked.id})
        locked.update(state="done")
        if locked.id == "p-3":
            raise ValueError("p-3 fails after its writes")
        if locked.id == "p-4":
            during["effects seen by another reader"] = _counts(reader, effects)

    assert handle(msg("p-0")).outcome is Outcome.PROCESSED
    keys = ["p-0", "p-1", "p-2", "p-3", "p-2", "p-4"]
    results = handle.consume_batch([msg(k) for k in keys])

    assert outcomes(results) == [
        Outcome.PROCESSED,  # ran, found its row done: no effect
        Outcome.PROCESSED,
        Outcome.PROCESSED,
        Outcome.FAILED,  # only this one comes back
        Outcome.PROCESSED,  # p-2 again: it saw its first copy's "done"
        Outcome.PROCESSED,
    ]
    assert during == {"effects seen by another reader": {"p-0": 1}}
    assert _counts(reader, effects) == {"p-0": 1, "p-1": 1, "p-2": 1, "p-4": 1}
    states = _states(reader, table)
    assert states["p-3"] == (0, None)  # created ahead and kept; its writes undone
    assert {k: states[k][1] for k in ("p-0", "p-1", "p-2", "p-4")} == dict.fromkeys(
        ("p-0", "p-1", "p-2", "p-4"), "done"
    )
    assert stats(name)["processed"] == 6 and stats(name)["failures"] == 1
    again = handle.consume_batch([msg("p-3"), msg("p-1")])
    assert outcomes(again) == [Outcome.FAILED, Outcome.PROCESSED]
    assert _counts(reader, effects) == {"p-0": 1, "p-1": 1, "p-2": 1, "p-4": 1}


def test_pessimistic_batch_holds_its_rows_until_it_commits(sql_url: Any, made: list[Any]) -> None:
    """While a batch runs, a consumer of one of its entities comes back later (the row
    is locked ahead), one of another entity runs; a batch meeting a row another holds
    (NOWAIT) gives that message back and runs the rest."""
    url, table = sql_url("pg"), _table()
    strategy = PessimisticRowLock(url, table=table, lock_timeout_s=0.3)
    other = PessimisticRowLock(url, table=table, nowait=True)
    made += [strategy, other]
    entered, release = threading.Event(), threading.Event()

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def slow(message: Message, ctx: Context) -> None:
        ctx.handle.update(state="batch")
        if ctx.key == "h-1":
            entered.set()
            assert release.wait(10)

    @idempotent(key="keys", strategy=other, namespace=NS)
    def quick(message: Message, ctx: Context) -> None:
        ctx.handle.update(state="quick")

    assert [quick(msg(k)).outcome for k in ("h-1", "h-2")] == [Outcome.PROCESSED] * 2
    results: list[Any] = []
    batch = threading.Thread(
        target=lambda: results.extend(slow.consume_batch([msg("h-1"), msg("h-2")]))
    )
    batch.start()
    try:
        assert entered.wait(10)
        # h-2 has not started yet, but its row was locked with h-1's before any handler
        during = [quick(msg("h-2")).outcome, quick(msg("h-9")).outcome]
    finally:
        release.set()
        batch.join(10)
    assert during == [Outcome.IN_PROGRESS, Outcome.PROCESSED]
    assert outcomes(results) == [Outcome.PROCESSED, Outcome.PROCESSED]

    # the other way round: another transaction holds h-2; the batch takes what it can
    with other.engine.connect() as conn, conn.begin():
        conn.execute(sa.text(f"SELECT * FROM {table} WHERE id = 'h-2' FOR UPDATE"))
        blocked = slow.consume_batch([msg("h-1"), msg("h-2"), msg("h-3")])
    assert outcomes(blocked) == [Outcome.PROCESSED, Outcome.IN_PROGRESS, Outcome.PROCESSED]
    assert not ack_of(blocked[1])


def test_pessimistic_batches_in_parallel_are_exactly_once(sql_url: Any, made: list[Any]) -> None:
    """4 threads hand overlapping shuffled batches of the same 40 entities (each entity
    several times): check-then-act under the batch's locks applies each once, and
    overlapping batches wait for each other instead of deadlocking."""
    url, table = sql_url("pg"), _table()
    strategy = PessimisticRowLock(url, table=table, lock_timeout_s=5.0)
    made.append(strategy)
    effects = _effects(strategy.engine, table)

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        locked: Locked = ctx.handle
        assert locked.row is not None
        if locked.row["state"] != "done":
            ctx.connection.execute(sa.insert(effects), {"entity": locked.id})
            locked.update(state="done")

    keys = [f"e{i}" for i in range(40)]
    errors: list[str] = []

    def worker(n: int) -> None:
        rng = random.Random(n)
        pending = [msg(k) for k in keys * 2]
        rng.shuffle(pending)
        for _ in range(50):  # bound: rounds of "reconsume later"
            back: list[Message] = []
            for i in range(0, len(pending), 16):
                chunk = pending[i : i + 16]
                for m, r in zip(chunk, handle.consume_batch(chunk)):
                    if not ack_of(r):
                        back.append(m)
            pending = back
            if not pending:
                return
        errors.append(f"worker {n}: {len(pending)} left")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert _counts(strategy.engine, effects) == dict.fromkeys(keys, 1)


@pytest.mark.parametrize("db", DBS)
def test_optimistic_batch_versions_move_message_by_message(
    db: str, sql_url: Any, made: list[Any]
) -> None:
    """With expected versions: a producer retry in the same batch finds the version its
    first copy moved (stale, dropped), a message ahead of its predecessor comes back,
    a failing handler's insert is undone and its redelivery applies it."""
    url, table = sql_url(db), _table()
    strategy = OptimisticVersion(
        url, table=table, expected_version=lambda m: int(m.properties["v"])
    )
    made.append(strategy)

    def vmsg(key: str, version: int) -> Message:
        return Message("Orders", b"{}", keys=(key,), properties={"v": str(version)})

    failing = {"c"}

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        handle_: Versioned = ctx.handle
        v = int(message.properties["v"])
        if v == 0:
            handle_.insert(state="s0")
        else:
            handle_.update(state=f"s{v}")
        if ctx.key in failing:
            raise ValueError("fails after its write")

    batch = [vmsg("a", 0), vmsg("a", 1), vmsg("a", 0), vmsg("b", 1), vmsg("c", 0), vmsg("b", 0)]
    results = handle.consume_batch(batch)
    assert outcomes(results) == [
        Outcome.PROCESSED,
        Outcome.PROCESSED,  # a at 1: saw its predecessor's insert in the same batch
        Outcome.DROPPED,  # a's v0 again: stale (the row is at 2)
        Outcome.IN_PROGRESS,  # b's v1 before b's v0: comes back
        Outcome.FAILED,
        Outcome.PROCESSED,
    ]
    assert [ack_of(r) for r in results] == [True, True, True, False, False, True]
    assert _states(strategy.engine, table) == {"a": (2, "s1"), "b": (1, "s0")}
    failing.clear()
    again = handle.consume_batch([vmsg("b", 1), vmsg("c", 0)])
    assert outcomes(again) == [Outcome.PROCESSED, Outcome.PROCESSED]
    assert _states(strategy.engine, table) == {"a": (2, "s1"), "b": (2, "s1"), "c": (1, "s0")}


def test_optimistic_batch_conflict_rereads_inside_the_batch(sql_url: Any, made: list[Any]) -> None:
    """A concurrent writer moves a row between the batch's read and the handler's
    update: the conflict undoes that message's attempt only, it reads the row again and
    applies on top; the batch's other messages are unaffected."""
    url, table = sql_url("pg"), _table()
    strategy = OptimisticVersion(url, table=table)
    made.append(strategy)
    with strategy.engine.begin() as conn:
        for entity in ("x", "y"):
            conn.execute(
                sa.text(f"INSERT INTO {table} (id, version) VALUES (:i, 1)"), {"i": entity}
            )
    writer = sa.create_engine(url)
    made.append(writer)
    seen: list[tuple[str, int | None]] = []

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        versioned: Versioned = ctx.handle
        seen.append((versioned.id, versioned.version))
        if versioned.id == "x" and len(seen) == 2:  # x's first attempt
            with writer.begin() as other:
                other.execute(
                    sa.text(f"UPDATE {table} SET version = version + 1, state = 'w' WHERE id = 'x'")
                )
        versioned.update(state=f"{versioned.id}-batch")

    results = handle.consume_batch([msg("y"), msg("x")])
    assert outcomes(results) == [Outcome.PROCESSED, Outcome.PROCESSED]
    assert seen == [("y", 1), ("x", 1), ("x", 2)]  # x read again after the conflict
    assert _states(strategy.engine, table) == {"x": (3, "x-batch"), "y": (2, "y-batch")}


@pytest.mark.parametrize("kind", ("pessimistic", "optimistic"))
def test_a_batch_reads_its_rows_by_key_on_a_new_postgresql_table(
    kind: str, sql_url: Any, made: list[Any]
) -> None:
    """On a table PostgreSQL has not analyzed yet (a new deployment's first minute), the
    batch's read looks each row up by its key, in the plan made with the batch's ids and
    in the generic plan a prepared statement keeps (psycopg prepares at the sixth run):
    no sequential scan of the table. (``id = ANY($1)`` was planned as one, and a batch's
    read then cost more as the table grew.)"""
    url, table = sql_url("pg"), _table()
    strategy: Any = (
        PessimisticRowLock(url, table=table)
        if kind == "pessimistic"
        else OptimisticVersion(url, table=table, expected_version=lambda m: 0)
    )
    made.append(strategy)

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        return None

    with strategy.engine.begin() as conn:  # a grown table, never analyzed
        conn.execute(
            sa.text(f"INSERT INTO {table} (id) SELECT 'old-' || g FROM generate_series(1, 3000) g")
        )
    results = handle.consume_batch([msg(f"new-{i}") for i in range(16)])
    assert outcomes(results) == [Outcome.PROCESSED] * 16
    read = strategy._rows.read_statement.compile(dialect=strategy.engine.dialect)
    ids = {**read.params, "ids": [f"old-{i}" for i in range(1, 33)]}
    with strategy.engine.connect() as conn:
        assert (
            conn.execute(
                sa.text("SELECT reltuples FROM pg_class WHERE relname = :t"), {"t": table}
            ).scalar_one()
            == -1
        )  # not analyzed
        for mode in ("force_custom_plan", "force_generic_plan"):
            conn.exec_driver_sql(f"SET plan_cache_mode = {mode}")
            plan = "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {read}", ids))
            assert f"Index Scan using {table}_pkey on {table}" in plan, (mode, plan)
            assert "Seq Scan" not in plan, (mode, plan)
        conn.rollback()
