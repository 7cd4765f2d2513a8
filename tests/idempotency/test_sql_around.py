"""OptimisticVersion and PessimisticRowLock against real SQLite and PostgreSQL.

Both run the handler inside a transaction on the business row and commit it after the
handler returns; the handler's own writes go through ``ctx.connection``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from idemp import Context, Message, Outcome, ack_of, idempotent, stats
from idemp.strategies import (
    Locked,
    OptimisticVersion,
    PessimisticRowLock,
    Strategy,
    VersionConflict,
    Versioned,
)

NS = "g/Orders"


def msg(key: str, version: int | None = None) -> Message:
    props = {} if version is None else {"version": str(version)}
    return Message("Orders", b"{}", keys=(key,), properties=props, msg_id=uuid.uuid4().hex)


@pytest.fixture
def made() -> Iterator[list[Strategy]]:
    strategies: list[Strategy] = []
    yield strategies
    for s in strategies:
        s.close()


def _table() -> str:
    return f"ent_{uuid.uuid4().hex[:10]}"


def _rows(engine: sa.Engine, table: str) -> dict[str, tuple[int, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT id, version, state FROM {table}")).all()
    return {r[0]: (int(r[1]), r[2]) for r in rows}


def _bump(url: str, table: str, entity: str) -> None:
    """A concurrent writer, outside the handler's transaction (autocommit)."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"UPDATE {table} SET version = version + 1, state = 'other' WHERE id = :i"),
            {"i": entity},
        )
    engine.dispose()


# -- OptimisticVersion ------------------------------------------------------------------


def test_optimistic_conflict_rereads_and_reapplies(sql_url: Any, made: list[Strategy]) -> None:
    url, table = sql_url("pg"), _table()
    strategy = OptimisticVersion(url, table=table, max_retries=2)
    made.append(strategy)
    seen: list[tuple[int, int | None]] = []

    @idempotent(key="keys", strategy=strategy, namespace=NS, name=f"opt-{table}")
    def handle(message: Message, ctx: Context) -> None:
        v: Versioned = ctx.handle
        seen.append((ctx.attempt, v.version))
        if v.version is None:
            v.insert(state="created")
            return
        if ctx.attempt == 1:  # someone else commits between our read and our update
            _bump(url, table, v.id)
        v.update(state="paid")

    assert handle(msg("o-1")).outcome is Outcome.PROCESSED  # creates at version 1
    result = handle(msg("o-1"))

    assert result.outcome is Outcome.PROCESSED
    assert seen == [(1, None), (1, 1), (2, 2)]  # attempt 2 re-read the bumped version
    assert _rows(strategy.engine, table) == {"o-1": (3, "paid")}


def test_optimistic_drop_mode_never_applies_a_conflicting_update(
    sql_url: Any, made: list[Strategy]
) -> None:
    url, table = sql_url("pg"), _table()
    strategy = OptimisticVersion(url, table=table, on_conflict="drop")
    made.append(strategy)
    name = f"opt-drop-{table}"

    @idempotent(key="keys", strategy=strategy, namespace=NS, name=name)
    def handle(message: Message, ctx: Context) -> None:
        v: Versioned = ctx.handle
        if v.version is None:
            v.insert(state="created")
            return
        _bump(url, table, v.id)
        v.update(state="paid")

    handle(msg("o-2"))
    result = handle(msg("o-2"))

    assert (result.outcome, ack_of(result)) == (Outcome.DROPPED, True)
    assert isinstance(result.error, VersionConflict)
    assert _rows(strategy.engine, table) == {"o-2": (2, "other")}
    assert stats(name)["guard_drops"] == 1


def test_optimistic_retries_exhausted_come_back_later(sql_url: Any, made: list[Strategy]) -> None:
    url, table = sql_url("pg"), _table()
    strategy = OptimisticVersion(url, table=table, max_retries=2)
    made.append(strategy)
    attempts: list[int] = []

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        v: Versioned = ctx.handle
        if v.version is None:
            v.insert(state="created")
            return
        attempts.append(ctx.attempt)
        _bump(url, table, v.id)  # every attempt loses
        v.update(state="paid")

    handle(msg("o-3"))
    result = handle(msg("o-3"))

    assert (result.outcome, ack_of(result)) == (Outcome.IN_PROGRESS, False)
    assert attempts == [1, 2, 3]
    assert _rows(strategy.engine, table) == {"o-3": (4, "other")}


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
def test_optimistic_expected_version_drops_stale_and_holds_ahead(
    kind: str, sql_url: Any, made: list[Strategy]
) -> None:
    table = _table()

    def expected(message: Message) -> int | None:
        v = message.property("version")
        return None if v is None else int(v)

    strategy = OptimisticVersion(sql_url(kind), table=table, expected_version=expected)
    made.append(strategy)
    applied: list[int | None] = []

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        v: Versioned = ctx.handle
        applied.append(v.version)
        if v.version is None:
            v.insert(state="s1")
        else:
            v.update(state=f"s{v.version + 1}")

    outcomes = [
        handle(msg("o-4", 0)).outcome,  # creates: version 1
        handle(msg("o-4", 0)).outcome,  # a redelivery: built against 0, row at 1 → stale
        handle(msg("o-4", 2)).outcome,  # ahead of its predecessor: come back later
        handle(msg("o-4", 1)).outcome,  # → version 2
        handle(msg("o-4", 2)).outcome,  # now its turn → version 3
    ]

    assert outcomes == [
        Outcome.PROCESSED,
        Outcome.DROPPED,
        Outcome.IN_PROGRESS,
        Outcome.PROCESSED,
        Outcome.PROCESSED,
    ]
    assert applied == [None, 1, 2]
    assert _rows(strategy.engine, table) == {"o-4": (3, "s3")}


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
def test_optimistic_handler_failure_rolls_back_its_writes(
    kind: str, sql_url: Any, made: list[Strategy]
) -> None:
    table = _table()
    strategy = OptimisticVersion(sql_url(kind), table=table)
    made.append(strategy)

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        ctx.handle.insert(state="created")
        raise RuntimeError("downstream failed after the write")

    result = handle(msg("o-5"))

    assert (result.outcome, ack_of(result)) == (Outcome.FAILED, False)
    assert _rows(strategy.engine, table) == {}


# -- PessimisticRowLock -----------------------------------------------------------------


@pytest.mark.parametrize("nowait", [False, True])
def test_pessimistic_lock_makes_a_concurrent_handler_come_back_later(
    nowait: bool, sql_url: Any, made: list[Strategy]
) -> None:
    table = _table()
    strategy = PessimisticRowLock(sql_url("pg"), table=table, lock_timeout_s=0.3, nowait=nowait)
    made.append(strategy)
    ran: list[str] = []

    @idempotent(key="keys", strategy=strategy, namespace=NS, pass_context=True)
    def handle(message: Message, ctx: Context) -> None:
        locked: Locked = ctx.handle
        ran.append(locked.id)
        locked.update(state="done")

    handle(msg("o-6"))  # the row exists now (created under the lock)
    entered, release = threading.Event(), threading.Event()

    @idempotent(key="keys", strategy=strategy, namespace=NS, pass_context=True)
    def slow(message: Message, ctx: Context) -> None:
        entered.set()
        assert release.wait(10)

    results: list[Any] = []
    holder = threading.Thread(target=lambda: results.append(slow(msg("o-6"))))
    holder.start()
    try:
        assert entered.wait(10)
        during = handle(msg("o-6"))
        other_entity = handle(msg("o-7"))  # row locks: another entity is not blocked
    finally:
        release.set()
        holder.join(10)
    after = handle(msg("o-6"))

    assert (during.outcome, ack_of(during)) == (Outcome.IN_PROGRESS, False)
    assert other_entity.outcome is Outcome.PROCESSED
    assert results[0].outcome is Outcome.PROCESSED
    assert after.outcome is Outcome.PROCESSED
    assert ran == ["o-6", "o-7", "o-6"]


def test_pessimistic_locks_a_new_entity_too(sql_url: Any, made: list[Strategy]) -> None:
    table = _table()
    strategy = PessimisticRowLock(sql_url("pg"), table=table, lock_timeout_s=0.3)
    made.append(strategy)
    entered, release = threading.Event(), threading.Event()

    @idempotent(key="keys", strategy=strategy, namespace=NS, pass_context=True)
    def slow(message: Message, ctx: Context) -> None:
        assert ctx.handle.row is not None and ctx.handle.row["state"] is None  # just inserted
        entered.set()
        assert release.wait(10)

    results: list[Any] = []
    holder = threading.Thread(target=lambda: results.append(slow(msg("new-1"))))
    holder.start()
    try:
        assert entered.wait(10)
        strategy2 = PessimisticRowLock(sql_url("pg"), table=table, lock_timeout_s=0.3)
        made.append(strategy2)

        @idempotent(key="keys", strategy=strategy2, namespace=NS)
        def other(message: Message) -> None:
            raise AssertionError("must not run while the creator holds the new row")

        during = other(msg("new-1"))
    finally:
        release.set()
        holder.join(10)

    assert during.outcome is Outcome.IN_PROGRESS
    assert results[0].outcome is Outcome.PROCESSED


def test_pessimistic_check_then_act_under_the_lock_is_exactly_once(
    sql_url: Any, made: list[Strategy]
) -> None:
    """8 threads × the same 50 entities: the handler checks the row and acts only if not
    done yet. Without the lock the check-then-act would double effects."""
    table = _table()
    url = sql_url("pg")
    strategy = PessimisticRowLock(url, table=table, lock_timeout_s=5.0)
    made.append(strategy)
    effects = sa.Table(
        f"{table}_fx",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("entity", sa.String(64)),
    )
    effects.metadata.create_all(strategy.engine)

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        locked: Locked = ctx.handle
        assert locked.row is not None
        if locked.row["state"] == "done":
            return
        ctx.connection.execute(sa.insert(effects), {"entity": locked.id})
        locked.update(state="done")

    keys = [f"e{i}" for i in range(50)]
    errors: list[str] = []

    def worker(n: int) -> None:
        pending = list(reversed(keys)) if n % 2 else list(keys)
        for _ in range(100):  # bound: rounds of "reconsume later"
            pending = [k for k in pending if not ack_of(handle(msg(k)))]
            if not pending:
                return
        errors.append(f"worker {n}: {pending}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert errors == []
    with strategy.engine.connect() as conn:
        counts: dict[str, int] = dict(
            conn.execute(
                sa.select(effects.c.entity, sa.func.count()).group_by(effects.c.entity)
            ).all()
        )
    assert counts == dict.fromkeys(keys, 1)


def test_pessimistic_on_sqlite_warns_once_and_serializes(
    sql_url: Any, made: list[Strategy], caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    import idemp.strategies.pessimistic as pessimistic

    monkeypatch.setattr(pessimistic, "_warned_sqlite", False)
    url = sql_url("sqlite")
    with caplog.at_level(logging.WARNING, logger="idemp"):
        strategy = PessimisticRowLock(url, table="ents", lock_timeout_s=0.1)
        second = PessimisticRowLock(url, table="ents", lock_timeout_s=0.1)
    made += [strategy, second]
    warnings = [r.getMessage() for r in caplog.records if "no row locks" in r.getMessage()]
    assert len(warnings) == 1 and "BEGIN IMMEDIATE" in warnings[0]

    entered, release = threading.Event(), threading.Event()

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def slow(message: Message) -> None:
        entered.set()
        assert release.wait(10)

    @idempotent(key="keys", strategy=second, namespace=NS)
    def other(message: Message) -> None:
        return None

    results: list[Any] = []
    holder = threading.Thread(target=lambda: results.append(slow(msg("a"))))
    holder.start()
    try:
        assert entered.wait(10)
        during = other(msg("b"))  # another entity: still blocked (database-wide lock)
    finally:
        release.set()
        holder.join(10)

    assert during.outcome is Outcome.IN_PROGRESS
    assert results[0].outcome is Outcome.PROCESSED
    assert other(msg("b")).outcome is Outcome.PROCESSED


def test_built_from_url_or_engine(sql_url: Any, made: list[Strategy]) -> None:
    url = sql_url("sqlite")
    engine = sa.create_engine(url)
    table = _table()
    for strategy in (
        OptimisticVersion(url, table=table),
        OptimisticVersion(engine, table=table),
        PessimisticRowLock(url, table=table),
        PessimisticRowLock(engine, table=table),
    ):
        made.append(strategy)
        assert strategy.table.name == table
    assert "password" not in repr(made[0])
    engine.dispose()


def test_a_handler_that_never_moves_the_version_is_reported(
    sql_url: Callable[[str], str], made: list[Strategy], caplog: pytest.LogCaptureFixture
) -> None:
    """With expected_version, dedup rests on the handler moving the version; one that
    writes only through ctx.connection commits, and the retry runs again: said once."""
    s = OptimisticVersion(sql_url("sqlite"), table=_table(), expected_version=lambda m: 0)
    made.append(s)

    @idempotent(key="keys", strategy=s, namespace="ns")
    def handle(message: Message, ctx: Context) -> None:
        return None  # no ctx.handle.update()/insert()

    with caplog.at_level(logging.WARNING, logger="idemp.strategies.optimistic"):
        outcomes = [handle(msg("o-1", 0)).outcome for _ in range(3)]
    assert outcomes == [Outcome.PROCESSED] * 3  # the retries ran again
    warned = [r for r in caplog.records if "without ctx.handle.update() or insert()" in r.message]
    assert len(warned) == 1
