"""DriverStatement: idemp's hot statements on the driver's cursor behave as through
SQLAlchemy (same rows, same errors), and go through SQLAlchemy whenever someone watches
the statements or a type converts values. Real SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from idemp.strategies._entity_batch import BatchRows
from idemp.strategies._sql import (
    DriverStatement,
    SizedStatements,
    busy,
    install_sqlite_begin,
    make_engine,
)
from idemp.strategies.unique_key import CLAIM_COLUMNS, UniqueKeyTable

both = pytest.mark.parametrize("kind", ["sqlite", "pg"])


@pytest.fixture
def engine(kind: str, sql_url: Callable[[str], str]) -> Iterator[Engine]:
    made = make_engine(sql_url(kind), 2.0, 4)
    install_sqlite_begin(made)
    yield made
    made.dispose()


def _table(engine: Engine, name: str) -> sa.Table:
    table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(64)),
        sa.Column("seen", sa.DateTime),
    )
    table.metadata.create_all(engine)
    return table


def _set_state(table: sa.Table, engine: Engine) -> DriverStatement:
    """An UPDATE of a row's state that runs on the driver's cursor."""
    statement = DriverStatement(
        sa.update(table)
        .where(table.c.id == sa.bindparam("b_id"))
        .values(state=sa.bindparam("b_to")),
        engine,
    )
    assert statement.sql is not None
    return statement


def _watched(engine: Engine) -> list[str]:
    seen: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    return seen


@both
def test_update_on_the_cursor_and_through_sqlalchemy_agree(kind: str, engine: Engine) -> None:
    table = _table(engine, f"ds_cas_{kind}")
    cas = DriverStatement(
        sa.update(table)
        .where(table.c.id == sa.bindparam("b_id"), table.c.state == sa.bindparam("b_from"))
        .values(state=sa.bindparam("b_to")),
        engine,
    )
    assert cas.sql is not None  # plain strings: runs on the driver's cursor
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"id": "a", "state": "new"}, {"id": "b", "state": "new"}])
        moved = cas.run(conn, {"b_id": "a", "b_from": "new", "b_to": "paid"})
        stale = cas.run(conn, {"b_id": "a", "b_from": "new", "b_to": "shipped"})
        assert (moved.rowcount, stale.rowcount) == (1, 0)
        assert not hasattr(moved, "mappings")  # the driver's own cursor
    seen = _watched(engine)
    with engine.begin() as conn:
        watched = cas.run(conn, {"b_id": "b", "b_from": "new", "b_to": "paid"})
        assert watched.rowcount == 1
        assert hasattr(watched, "mappings")  # SQLAlchemy's result: the listener saw it
    assert [s for s in seen if s.startswith("UPDATE")] == [cas.sql]
    with engine.connect() as conn:
        states = dict(conn.execute(sa.select(table.c.id, table.c.state)).all())
    assert states == {"a": "paid", "b": "paid"}


@both
def test_a_type_that_converts_values_keeps_sqlalchemy(kind: str, engine: Engine) -> None:
    table = _table(engine, f"ds_types_{kind}")
    with_date = DriverStatement(sa.select(table).where(table.c.id == sa.bindparam("i")), engine)
    without = DriverStatement(
        sa.select(table.c.id, table.c.state).where(table.c.id == sa.bindparam("i")), engine
    )
    # a date (and any column not a plain string or integer) comes back as SQLAlchemy
    # converts it, on every database: SQLAlchemy reads it
    assert with_date.sql is None
    assert without.sql is not None
    for other in (sa.Numeric(10, 2), sa.Boolean(), sa.JSON(), sa.Enum("a", "b", name="ab")):
        typed = sa.select(sa.cast(table.c.state, other).label("x")).where(
            table.c.id == sa.bindparam("i")
        )
        assert DriverStatement(typed, engine).sql is None, other
    defaulted = DriverStatement(sa.update(table).values(state="x"), engine)
    assert defaulted.sql is None  # a value bound in the statement: SQLAlchemy supplies it


@both
def test_batch_rows_read_and_create_as_sqlalchemy_would(kind: str, engine: Engine) -> None:
    table = _table(engine, f"ds_rows_{kind}")
    rows = BatchRows(table, "id", engine, lock=True)
    ids = ["k3", "k1", "k2"]
    with engine.begin() as conn:
        assert rows.create(conn, ids)
        assert rows.create(conn, ids)  # existing rows are left alone
        conn.execute(table.update().where(table.c.id == "k2").values(state="held"))
        direct = rows.read(conn, ids)
    seen = _watched(engine)
    with engine.begin() as conn:
        through = rows.read(conn, ids)
    assert seen  # the second read went through SQLAlchemy
    as_plain = {k: {"id": v["id"], "state": v["state"]} for k, v in direct.items()}
    assert as_plain == {k: {"id": v["id"], "state": v["state"]} for k, v in through.items()}
    assert as_plain == {
        "k1": {"id": "k1", "state": None},
        "k2": {"id": "k2", "state": "held"},
        "k3": {"id": "k3", "state": None},
    }


@both
def test_driver_errors_come_as_sqlalchemy_errors(kind: str, engine: Engine) -> None:
    table = _table(engine, f"ds_err_{kind}")
    insert = DriverStatement(table.insert(), engine, ["id", "state"])
    assert insert.sql is not None
    with engine.begin() as conn:
        insert.run(conn, {"id": "dup", "state": "a"})
    with engine.connect() as conn, conn.begin():
        with pytest.raises(DBAPIError) as caught:
            insert.run(conn, {"id": "dup", "state": "b"})
    assert isinstance(caught.value, sa.exc.IntegrityError)
    assert caught.value.orig is not None and not caught.value.connection_invalidated


@both
def test_sized_statements_compile_once_per_size_up_to_the_limit(kind: str, engine: Engine) -> None:
    built: list[int] = []

    def build(size: int) -> Any:
        built.append(size)
        return sa.select(sa.literal_column("1"))

    sized = SizedStatements(build, engine, limit=4)
    assert sized.get(2) is sized.get(2)
    assert sized.get(4) is not None
    assert sized.get(5) is None and sized.get(0) is None
    assert built == [2, 4]


@both
def test_rows_go_to_the_driver_as_values_only_when_its_placeholders_run_row_by_row(
    kind: str, engine: Engine
) -> None:
    table = _table(engine, f"rows_{kind}")

    def build(size: int) -> Any:
        rows: list[dict[str, Any]] = [
            {"id": sa.bindparam(f"id_{i}"), "state": sa.bindparam(f"state_{i}")}
            for i in range(size)
        ]
        return table.insert().values(rows)

    values = [("a", "x"), ("b", "y"), ("c", "z")]
    statement = DriverStatement(build(3), engine)
    with engine.begin() as conn:
        statement.run_rows(conn, ("id", "state"), values)
    # SQLite's placeholders are positional and row by row: the values went as they came;
    # PostgreSQL's driver takes names, so they went as a dict
    assert statement._row_major is (kind == "sqlite")
    # columns named in another order than the placeholders': by name, not by position
    other = DriverStatement(build(2), engine)
    with engine.begin() as conn:
        other.run_rows(conn, ("state", "id"), [("w", "d"), ("v", "e")])
    assert other._row_major is False
    seen = _watched(engine)  # watched: SQLAlchemy runs it, with the same rows
    watched = DriverStatement(build(1), engine)
    with engine.begin() as conn:
        watched.run_rows(conn, ("id", "state"), [("f", "u")])
    assert len(seen) == 1
    with engine.connect() as conn:
        rows = conn.execute(sa.select(table.c.id, table.c.state).order_by(table.c.id)).all()
    assert [tuple(r) for r in rows] == [
        ("a", "x"),
        ("b", "y"),
        ("c", "z"),
        ("d", "w"),
        ("e", "v"),
        ("f", "u"),
    ]


@both
def test_claim_rows_have_the_claim_columns(kind: str, sql_url: Callable[[str], str]) -> None:
    table = UniqueKeyTable(sql_url(kind), transactional=True)
    try:
        compiled = table._insert_statement().compile(dialect=table.engine.dialect)
        assert set(CLAIM_COLUMNS) == set(compiled.binds) == {c.name for c in table.table.c}
    finally:
        table.close()


def test_sqlite_write_lock_held_elsewhere_is_busy(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    engine = make_engine(f"sqlite:///{path}", 0.05, 1)  # busy timeout: 1 s, its floor
    table = _table(engine, "ds_busy")
    cas = _set_state(table, engine)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        with engine.connect() as conn:
            with pytest.raises(DBAPIError) as caught:
                cas.run(conn, {"b_id": "x", "b_to": "y"})
        assert busy(caught.value)
        assert isinstance(caught.value.orig, sqlite3.OperationalError)
    finally:
        other.execute("ROLLBACK")
        other.close()
        engine.dispose()


def test_sqlite_begin_is_immediate_on_idemp_engines_only(tmp_path: Path) -> None:
    """idemp's SQLite engines take the write lock at BEGIN (the dialect's own
    ``do_begin``, no connection events); another engine on the same file keeps
    SQLAlchemy's plain, lazy BEGIN."""
    url = f"sqlite:///{tmp_path / 'begin.db'}"
    ours = make_engine(url, 0.05, 1)
    install_sqlite_begin(ours)
    plain = sa.create_engine(url, connect_args={"timeout": 0.05})
    table = _table(ours, "ds_begin")
    probe = sqlite3.connect(tmp_path / "begin.db", isolation_level=None, timeout=0.05)
    try:
        with ours.connect() as conn, conn.begin():
            conn.execute(sa.select(table.c.id)).fetchall()  # a read: the lock is held already
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                probe.execute("BEGIN IMMEDIATE")
            with plain.connect() as other, other.begin():  # not immediate: reads on
                assert other.execute(sa.select(table.c.id)).fetchall() == []
        assert not ours.dispatch.begin and not ours._has_events  # nothing per statement
        probe.execute("BEGIN IMMEDIATE")  # committed and released: the probe gets the lock
        with ours.connect() as conn:
            with pytest.raises(DBAPIError) as caught:  # and ours now waits for the probe's
                conn.begin()
            assert busy(caught.value)
        probe.execute("ROLLBACK")
    finally:
        probe.close()
        ours.dispose()
        plain.dispose()


def test_a_dropped_connection_is_invalidated_as_sqlalchemy_does(
    sql_url: Callable[[str], str],
) -> None:
    engine = make_engine(sql_url("pg"), 2.0, 2)
    table = _table(engine, "ds_dropped")
    cas = _set_state(table, engine)
    try:
        with engine.connect() as conn:
            conn.begin()
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            with engine.connect() as killer:
                killer.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
            with pytest.raises(DBAPIError) as caught:
                cas.run(conn, {"b_id": "x", "b_to": "y"})
            assert caught.value.connection_invalidated
            assert conn.invalidated
        with engine.connect() as conn:  # the pool hands out a live connection again
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
    finally:
        engine.dispose()
