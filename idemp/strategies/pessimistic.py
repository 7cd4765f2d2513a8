"""Pessimistic row lock: ``SELECT … FOR UPDATE`` on the business row, inside the
transaction the handler writes in; the pipeline commits it after the handler returns.
Concurrent handlers of one entity (other threads, other processes) wait for the lock up
to ``lock_timeout_s`` (or not at all with ``nowait=True``) and then come back later
(IN_PROGRESS → reconsume later), never acked.

A row lock serializes handlers of one entity; it does not by itself recognise a
duplicate. Exactly-once effects come from what the handler checks under the lock (the
row's state: see ``idemp.guards``, which composes with this strategy).

A missing row is inserted first (``lock_missing=True``), so a new entity is locked too:
a concurrent creator waits on the primary key until the first commits.

**SQLite has no row locks.** There the strategy takes the database-wide write lock
(``BEGIN IMMEDIATE``): correct, but every handler of every entity is serialized. A
warning is logged once per process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from idemp.outcome import Outcome
from idemp.strategies._entity_batch import BatchRows, EntityBatch, Row, begin_alone
from idemp.strategies._sql import (
    busy,
    close_quietly,
    commit_and_close,
    entity_table,
    insert_ignore,
    install_sqlite_begin,
    make_engine,
    set_lock_timeout,
    store_failure,
)
from idemp.strategies.base import BatchSession, Job, Strategy, Ticket, Verdict

logger = logging.getLogger("idemp")
_warned_sqlite = False


def _warn_sqlite_once() -> None:
    global _warned_sqlite
    if not _warned_sqlite:
        _warned_sqlite = True
        logger.warning(
            "PessimisticRowLock on SQLite: SQLite has no row locks; using BEGIN IMMEDIATE "
            "(the database-wide write lock), so all handlers are serialized"
        )


@dataclass(slots=True)
class Locked:
    """``ctx.handle`` of :class:`PessimisticRowLock`: the locked row (None if it was just
    inserted empty) and the connection whose transaction holds the lock."""

    connection: Connection
    table: sa.Table
    id_column: str
    id: Any
    row: Mapping[str, Any] | None

    def update(self, **values: Any) -> None:
        t = self.table
        self.connection.execute(sa.update(t).where(t.c[self.id_column] == self.id).values(values))


class PessimisticRowLock(Strategy):
    """``PessimisticRowLock("postgresql+psycopg://…")`` or ``PessimisticRowLock(engine)``;
    ``table`` (reflected; created generic if missing), ``id_column``, ``lock_timeout_s``,
    ``nowait``, ``lock_missing``, ``entity_id`` (``fn(job)``, default the business key)."""

    name = "pessimistic_row_lock"

    def __init__(
        self,
        engine: str | Engine,
        *,
        table: str = "idemp_entities",
        id_column: str = "id",
        lock_timeout_s: float = 5.0,
        nowait: bool = False,
        lock_missing: bool = True,
        entity_id: Callable[[Job], Any] | None = None,
        create: bool = True,
        pool_size: int = 8,
    ) -> None:
        self._owns_engine = isinstance(engine, str)
        # An engine we make has the lock timeout as a session setting; a given one gets
        # SET LOCAL in each transaction.
        self._set_timeout = not self._owns_engine
        if isinstance(engine, str):
            engine = make_engine(engine, lock_timeout_s, pool_size)
        self.engine: Engine = engine
        self.dialect = engine.dialect.name
        if self.dialect == "sqlite":
            _warn_sqlite_once()
        install_sqlite_begin(engine)
        self.table = entity_table(
            engine, table, create=create, id_column=id_column, version_column="version"
        )
        self.id_column = id_column
        self.lock_timeout_ms = int(lock_timeout_s * 1000)
        self.nowait = nowait
        self.lock_missing = lock_missing
        self.entity_id = entity_id or (lambda job: job.key)
        t = self.table
        self._lock = (
            sa.select(t).where(t.c[id_column] == sa.bindparam("id")).with_for_update(nowait=nowait)
        )
        self._rows = BatchRows(t, id_column, self.engine, lock=True, nowait=nowait)
        self._insert = insert_ignore(t, self.dialect)

    def __repr__(self) -> str:
        url = self.engine.url.render_as_string(hide_password=True)
        return f"PessimisticRowLock({url}, table={self.table.name}, nowait={self.nowait})"

    def _ensure_row(self, conn: Connection, entity: Any) -> None:
        row = {self.id_column: entity}
        if self._insert is not None:
            conn.execute(self._insert, row)
            return
        try:
            with conn.begin_nested():
                conn.execute(sa.insert(self.table), row)
        except IntegrityError:
            pass

    def open_transaction(self) -> Connection:
        conn = self.engine.connect()
        try:
            conn.begin()
            if self._set_timeout and not self.nowait:
                set_lock_timeout(conn, self.lock_timeout_ms)
        except BaseException:
            close_quietly(conn)
            raise
        return conn

    def read_row(self, conn: Connection, entity: Any) -> Row | None:
        """Lock the entity's row (first creating it, with ``lock_missing``)."""
        row = conn.execute(self._lock, {"id": entity}).mappings().first()
        if row is None and self.lock_missing:
            self._ensure_row(conn, entity)  # waits for a concurrent creator's commit
            row = conn.execute(self._lock, {"id": entity}).mappings().first()
        return row

    def read_rows(self, conn: Connection, entities: list[Any]) -> dict[Any, Row | None]:
        """A batch's rows created and locked in id order, in two statements. Only the
        rows found are answered: an id the database normalises (another type, padding)
        is then read at its turn."""
        if self.lock_missing and not self._rows.create(conn, entities):
            for entity in entities:
                self._ensure_row(conn, entity)
        return dict(self._rows.read(conn, entities))

    def ticket(self, job: Job, conn: Connection, entity: Any, row: Row | None) -> Ticket:
        data = None if row is None else dict(row)
        handle = Locked(conn, self.table, self.id_column, entity, data)
        return Ticket(job, Verdict.RUN, handle=handle, atomic=True, private=conn)

    def committed(self, ticket: Ticket) -> None:
        return None

    def begin(self, job: Job) -> Ticket:
        return begin_alone(self, job)

    def session(self, jobs: Sequence[Job]) -> BatchSession | None:
        """The batch in one transaction: its rows locked in one statement, a savepoint
        per message, one COMMIT (:class:`~idemp.strategies._entity_batch.EntityBatch`)."""
        return EntityBatch(self, jobs) if len(jobs) >= 2 else None

    def commit(self, ticket: Ticket) -> None:
        commit_and_close(ticket.private)

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        close_quietly(ticket.private)

    def classify(self, error: BaseException) -> Outcome | None:
        if busy(error):  # a lock the handler itself waited for
            return Outcome.IN_PROGRESS
        if store_failure(error):
            return Outcome.STORE_ERROR
        return None

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()
