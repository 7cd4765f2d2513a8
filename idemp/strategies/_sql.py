"""SQL helpers shared by the SQLAlchemy strategies (unique-key table, optimistic version,
pessimistic row lock): engine building, SQLite's BEGIN IMMEDIATE, lock-timeout detection.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from itertools import chain
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SQLITE_HOOKED = "_idemp_begin_immediate"
T = TypeVar("T")


def valid_identifier(name: str) -> str:
    """Table names come from configuration: accept plain SQL identifiers only."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"not a valid SQL table name: {name!r} (letters, digits, _; max 63)")
    return name


def make_engine(
    url: str, lock_timeout_s: float, pool_size: int, *, autocommit: bool = False
) -> Engine:
    """An engine for a URL. SQLite: WAL (readers never wait for the writer) and a busy
    timeout of ``lock_timeout_s``. Others: a pool without ``pool_pre_ping`` (a ping is a
    round trip per checkout); a connection that died in the pool fails its first statement,
    which the strategies map to a store error, and SQLAlchemy then invalidates the pool.
    ``autocommit`` (not SQLite): every connection in autocommit mode from the start, for
    callers that only run single statements: ``execution_options(isolation_level=…)``
    instead switches the mode at every checkout and back at every return."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = sa.create_engine(
            url, connect_args={"timeout": max(lock_timeout_s, 1.0)}, pool_size=pool_size
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql":
        # The lock timeout as a session setting at connect time: no SET per transaction.
        connect_args["options"] = f"-c lock_timeout={int(lock_timeout_s * 1000)}"
    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
    return sa.create_engine(
        url, pool_size=pool_size, max_overflow=pool_size, connect_args=connect_args, **options
    )


def install_sqlite_begin(engine: Engine) -> None:
    """SQLAlchemy, not the driver, begins SQLite transactions, and with BEGIN IMMEDIATE
    (take the write lock now), as in SQLAlchemy's pysqlite recipe. The BEGIN is the
    engine's dialect's own ``do_begin`` rather than the recipe's ``begin`` listener: any
    connection event makes SQLAlchemy dispatch events around every statement on the
    engine, ~10 µs per ``execute`` of the listeners' own statements (a fifth of a plain
    INSERT), for nothing."""
    if engine.dialect.name != "sqlite" or getattr(engine, _SQLITE_HOOKED, False):
        return

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    def _begin(dbapi_conn: Any) -> None:
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")
        finally:
            cursor.close()

    # this engine's own dialect object (create_engine makes one per engine)
    setattr(engine.dialect, "do_begin", _begin)  # noqa: B010  (mypy: a method)
    setattr(engine, _SQLITE_HOOKED, True)
    engine.dispose()  # pooled connections predate the connect hook


def busy(exc: BaseException) -> bool:
    """A lock wait that timed out (or NOWAIT found the row locked): someone else holds
    this entity (or SQLite's write lock)."""
    if not isinstance(exc, DBAPIError):
        return False
    text = str(exc.orig).lower() if exc.orig is not None else str(exc).lower()
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return (
        code == "55P03"  # PostgreSQL lock_not_available (lock_timeout, NOWAIT)
        or code == "40P01"  # PostgreSQL deadlock_detected: the other side goes on
        or "database is locked" in text  # SQLite busy timeout
        or "lock wait timeout" in text  # MySQL 1205
        or "deadlock found" in text  # MySQL 1213
    )


def set_lock_timeout(conn: Connection, timeout_ms: int) -> None:
    """Bound row-lock waits inside the current transaction (PostgreSQL, MySQL)."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {int(timeout_ms)}")
    elif dialect in ("mysql", "mariadb"):
        conn.exec_driver_sql(
            f"SET SESSION innodb_lock_wait_timeout = {max(1, int(timeout_ms) // 1000)}"
        )


def close_quietly(conn: Connection) -> None:
    """Close (rolling back any open transaction); a dead connection is already gone."""
    try:
        conn.close()
    except SQLAlchemyError:
        conn.invalidate()


def commit_and_close(conn: Connection) -> None:
    """Commit the handler's transaction (dedup row, entity row and the handler's own
    writes go together) and give the connection back whatever happened."""
    from idemp.strategies.base import StoreError

    try:
        conn.commit()
    except SQLAlchemyError as exc:
        raise StoreError(f"commit failed: {exc}") from exc
    finally:
        close_quietly(conn)


def entity_table(
    engine: Engine, name: str, *, create: bool, id_column: str, version_column: str | None
) -> sa.Table:
    """The business table of the "around" strategies: reflected if it exists, else (when
    ``create``) a generic one: id, version, state, data."""
    valid_identifier(name)
    metadata = sa.MetaData()
    if sa.inspect(engine).has_table(name):
        return sa.Table(name, metadata, autoload_with=engine)
    if not create:
        raise LookupError(f"table {name!r} does not exist (create=False)")
    columns: list[sa.Column[Any]] = [sa.Column(id_column, sa.String(255), primary_key=True)]
    if version_column is not None:
        columns.append(sa.Column(version_column, sa.BigInteger, nullable=False, server_default="0"))
    columns += [sa.Column("state", sa.String(64)), sa.Column("data", sa.Text)]
    table = sa.Table(name, metadata, *columns)
    try:
        metadata.create_all(engine, checkfirst=True)
    except DBAPIError as exc:  # another process created it at the same time
        if "already exists" not in str(exc) and "duplicate key" not in str(exc):
            raise
    return table


def insert_ignore(table: sa.Table, dialect: str) -> Any:
    """INSERT that does nothing when the primary key exists (PostgreSQL, SQLite, MySQL);
    None elsewhere (the caller then inserts in a savepoint and ignores the IntegrityError)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()
    if dialect in ("mysql", "mariadb"):
        return sa.insert(table).prefix_with("IGNORE")
    return None


def store_failure(exc: BaseException) -> bool:
    """The connection itself failed (dropped, server restarted): a store error, not a
    handler failure."""
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


class DriverStatement:
    """One of idemp's own hot statements, compiled once for the engine's dialect and run
    on the driver's cursor. SQLAlchemy's execution machinery (cache lookup, parameter
    construction, result set-up) cost several times what SQLite spends executing such a
    statement: a ``@guarded`` batch message went from ~450 to ~360 µs of CPU when its
    compare-and-set stopped going through it.

    ``Connection.execute`` runs it instead whenever that would behave differently: a
    parameter or result type that converts values (a PostgreSQL array, a date on
    SQLite), an IN list expanded at run time, a default bound in the statement, and a
    connection whose statements someone watches (``echo``, ``before/after_cursor_execute``
    listeners such as tracing). Driver errors are raised as SQLAlchemy raises them
    (``DBAPIError`` with ``orig``; a dropped connection is invalidated), so callers
    handle one kind of error either way."""

    __slots__ = ("statement", "sql", "names", "positional", "_row_major")

    def __init__(
        self, statement: Any, engine: Engine, column_keys: Sequence[str] | None = None
    ) -> None:
        """``column_keys``: the columns an INSERT's parameters give (compiled for them)."""
        self.statement = statement
        self.sql: str | None = None
        self.names: tuple[str, ...] = ()
        self.positional = False
        self._row_major: bool | None = None  # see run_rows
        dialect = engine.dialect
        try:
            keys = list(column_keys) if column_keys is not None else None
            compiled: Any = statement.compile(dialect=dialect, column_keys=keys)
            positional = bool(compiled.positional)
            names = list(compiled.positiontup or ()) if positional else list(compiled.binds)
            plain = (
                not compiled._bind_processors
                and not compiled.escaped_bind_names
                and "POSTCOMPILE" not in compiled.string
                and all(compiled.binds[n].required for n in names)
                and all(_plain_column(c[3], dialect) for c in compiled._result_columns)
            )
        except Exception:  # another SQLAlchemy, a type it cannot tell: keep its path
            return
        if plain:
            self.sql, self.names, self.positional = compiled.string, tuple(names), positional

    def _watched(self, conn: Connection) -> bool:
        return bool(
            self.sql is None
            or conn._echo
            or conn.dispatch.before_cursor_execute
            or conn.dispatch.after_cursor_execute
        )

    def _args(self, params: dict[str, Any]) -> Any:
        return tuple(params[n] for n in self.names) if self.positional else params

    def run(self, conn: Connection, params: dict[str, Any]) -> Any:
        """Execute; returns the driver's cursor or SQLAlchemy's result (either has
        ``rowcount``, ``fetchall`` and iterates as tuples)."""
        if self._watched(conn):
            return conn.execute(self.statement, params)
        return self._on_cursor(conn, "execute", self._args(params))

    def run_rows(
        self, conn: Connection, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> Any:
        """A multi-row statement whose parameters are named ``{column}_{i}``, given as
        value rows in ``columns`` order. A positional driver whose placeholders run row by
        row in that order takes the values as they come: no name is looked up (a dict of
        11 names a row, built and read back, cost a batch of 32 ~3 µs a message)."""
        if self._row_major is None:
            expected = tuple(f"{c}_{i}" for i in range(len(rows)) for c in columns)
            self._row_major = self.positional and self.names == expected
        if self._row_major and not self._watched(conn):
            return self._on_cursor(conn, "execute", tuple(chain.from_iterable(rows)))
        named = {f"{c}_{i}": v for i, row in enumerate(rows) for c, v in zip(columns, row)}
        return self.run(conn, named)

    def run_many(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Execute once per parameter set (no RETURNING)."""
        if self._watched(conn):
            conn.execute(self.statement, rows)
        else:
            self._on_cursor(conn, "executemany", [self._args(r) for r in rows])

    def _on_cursor(self, conn: Connection, method: str, args: Any) -> Any:
        sql = self.sql
        fairy: Any = conn.connection
        cursor = fairy.dbapi_connection.cursor()
        dbapi_error = conn.dialect.loaded_dbapi.Error
        try:
            getattr(cursor, method)(sql, args)
        except dbapi_error as exc:
            dropped = bool(conn.dialect.is_disconnect(exc, fairy, cursor))
            if dropped:  # as SQLAlchemy does: the pool's older connections go too
                invalidate_pool = getattr(conn.engine.pool, "_invalidate", None)
                if invalidate_pool is not None:
                    invalidate_pool(fairy, exc)
                conn.invalidate(exc)
            raise DBAPIError.instance(
                sql, args, exc, dbapi_error, connection_invalidated=dropped, dialect=conn.dialect
            ) from exc
        return cursor

    def mappings(self, conn: Connection, params: dict[str, Any]) -> list[Mapping[Any, Any]]:
        """A SELECT's rows as mappings by column name."""
        if self._watched(conn):
            return list(conn.execute(self.statement, params).mappings().all())
        cursor = self._on_cursor(conn, "execute", self._args(params))
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def _plain_column(type_: Any, dialect: Any) -> bool:
    """A result column the driver hands back as SQLAlchemy would: strings and integers
    with no conversion. Anything else (dates, decimals, booleans, JSON, enums) keeps
    SQLAlchemy's path, whatever the dialect's processors say without a cursor."""
    return (
        isinstance(type_, (sa.String, sa.Integer))
        and not isinstance(type_, sa.Enum)
        and type_._cached_result_processor(dialect, None) is None
    )


class SizedStatements:
    """A statement whose text grows with what it carries (a multi-row VALUES, an IN
    list): one :class:`DriverStatement` per size, compiled at its first use. Sizes above
    ``limit`` get None (the caller's generic statement runs them)."""

    def __init__(self, build: Callable[[int], Any], engine: Engine, limit: int = 64) -> None:
        self.build, self.engine, self.limit = build, engine, limit
        self._by_size: dict[int, DriverStatement] = {}

    def get(self, size: int) -> DriverStatement | None:
        if not 0 < size <= self.limit:
            return None
        statement = self._by_size.get(size)
        if statement is None:
            statement = self._by_size[size] = DriverStatement(self.build(size), self.engine)
        return statement


class Savepoints:
    """A savepoint per message inside one batch transaction, as the driver's own
    statements (SQLAlchemy's ``begin_nested`` compiles two statements per message: a
    third of a message's CPU on SQLite).

    A message's savepoint is released when the next one is set, in the same round trip
    on PostgreSQL (two statements in one simple query), and not at all for the last: the
    COMMIT releases it. So a message costs one round trip here, not two."""

    __slots__ = ("cursor", "open", "one_trip")

    def __init__(self, conn: Connection) -> None:
        self.cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        self.open = False
        self.one_trip = conn.dialect.name == "postgresql"

    def sql(self, statement: str) -> None:
        from idemp.strategies.base import StoreError

        try:
            self.cursor.execute(statement)
        except Exception as exc:  # the driver's own error class: the batch is broken
            raise StoreError(f"{statement} failed: {exc}") from exc

    def next(self) -> None:
        """The next message begins: its own savepoint (the previous one's kept)."""
        if not self.open:
            self.sql("SAVEPOINT idemp_msg")
        elif self.one_trip:
            self.sql("RELEASE SAVEPOINT idemp_msg; SAVEPOINT idemp_msg")
        else:
            self.sql("RELEASE SAVEPOINT idemp_msg")
            self.sql("SAVEPOINT idemp_msg")
        self.open = True

    def attempt(self, name: str, step: Callable[[], T]) -> T | None:
        """Run ``step`` in a savepoint of its own (a batch's work ahead of its first
        message): a database error in it, such as a lock wait that timed out, undoes
        only that step (→ None) and leaves the batch's transaction usable."""
        self.sql(f"SAVEPOINT {name}")
        try:
            out = step()
        except SQLAlchemyError:
            self.sql(f"ROLLBACK TO SAVEPOINT {name}")
            self.sql(f"RELEASE SAVEPOINT {name}")
            return None
        self.sql(f"RELEASE SAVEPOINT {name}")
        return out

    def undo(self) -> None:
        """Undo the current message's work (only its own)."""
        self.open = False
        self.sql("ROLLBACK TO SAVEPOINT idemp_msg")
        self.sql("RELEASE SAVEPOINT idemp_msg")
