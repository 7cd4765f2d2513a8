"""Optimistic version: the business row carries a version; an update applies only to the
version the handler read (``UPDATE … SET …, version = version + 1 WHERE id = :id AND
version = :v``). Nothing is locked while the handler runs; a concurrent writer makes the
update match no row: a :class:`VersionConflict`.

On conflict, by setting: ``on_conflict="retry"`` re-reads the row and re-runs the handler
(up to ``max_retries`` times, then reconsume later: the row is hot, the message is not
lost); ``on_conflict="drop"`` treats the message as stale and drops it (never applied).

Versions guard against lost and stale updates, not against duplicates, unless the message
says which version it was built against (``expected_version=fn(message)``): then a
redelivery or a producer retry finds the version moved on and is dropped as stale, and a
message ahead of its predecessor (version still lower) comes back later.

The handler gets ``ctx.handle``, a :class:`Versioned` (the row, its version, ``update()``,
``insert()``), and writes its other effects through ``ctx.connection``: one transaction,
committed by the pipeline after the handler returns. SQLite serializes writers
(BEGIN IMMEDIATE), so there only expected versions ever conflict.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from idemp.message import Message
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

log = logging.getLogger("idemp.strategies.optimistic")


class VersionConflict(RuntimeError):
    """The row's version moved between the handler's read and its update."""


@dataclass(slots=True)
class Versioned:
    """``ctx.handle`` of :class:`OptimisticVersion`: the row as read, inside the
    transaction the pipeline commits."""

    connection: Connection
    table: sa.Table
    id_column: str
    version_column: str
    id: Any
    row: Mapping[str, Any] | None
    version: int | None
    updates: int = field(default=0)
    #: INSERT … ON CONFLICT DO NOTHING RETURNING id (PostgreSQL, SQLite): a lost
    #: creation race returns no row, not an error that needs a savepoint to survive
    insert_new: Any = field(default=None, repr=False)

    def update(self, **values: Any) -> int:
        """Apply ``values`` if the row is still at the version read; → the new version.
        Raises :class:`VersionConflict` otherwise (the pipeline re-reads or drops)."""
        if self.version is None:
            raise VersionConflict(f"{self.id!r}: no row to update (insert() it first)")
        t = self.table
        vcol = t.c[self.version_column]
        done = self.connection.execute(
            sa.update(t)
            .where(t.c[self.id_column] == self.id, vcol == self.version)
            .values(**values, **{self.version_column: vcol + 1})
        ).rowcount
        if done != 1:
            raise VersionConflict(f"{self.id!r}: version {self.version} is no longer current")
        self.version += 1
        self.updates += 1
        return self.version

    def insert(self, **values: Any) -> int:
        """Create the row at version 1; another creator got there first → conflict."""
        if self.version is not None:
            raise VersionConflict(f"{self.id!r}: already exists at version {self.version}")
        row = {self.id_column: self.id, self.version_column: 1, **values}
        if self.insert_new is not None:
            if self.connection.execute(self.insert_new, row).first() is None:
                raise VersionConflict(f"{self.id!r}: created concurrently")
        else:
            try:
                with self.connection.begin_nested():
                    self.connection.execute(sa.insert(self.table), row)
            except IntegrityError as exc:
                raise VersionConflict(f"{self.id!r}: created concurrently") from exc
        self.version = 1
        self.updates += 1
        return 1


class OptimisticVersion(Strategy):
    """``OptimisticVersion("postgresql+psycopg://…")`` or ``OptimisticVersion(engine)``;
    ``table`` (reflected; created generic — id, version, state, data — if missing),
    ``id_column``, ``version_column``, ``on_conflict`` (``"retry"``/``"drop"``),
    ``max_retries``, ``expected_version`` (``fn(message) -> int | None``), ``entity_id``
    (``fn(job)``, default the business key)."""

    name = "optimistic_version"

    def __init__(
        self,
        engine: str | Engine,
        *,
        table: str = "idemp_entities",
        id_column: str = "id",
        version_column: str = "version",
        on_conflict: Literal["retry", "drop"] = "retry",
        max_retries: int = 3,
        expected_version: Callable[[Message], int | None] | None = None,
        entity_id: Callable[[Job], Any] | None = None,
        lock_timeout_s: float = 5.0,
        create: bool = True,
        pool_size: int = 8,
    ) -> None:
        if on_conflict not in ("retry", "drop"):
            raise ValueError(f"on_conflict must be 'retry' or 'drop', not {on_conflict!r}")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self._owns_engine = isinstance(engine, str)
        # An engine we make has the lock timeout as a session setting; a given one gets
        # SET LOCAL in each transaction.
        self._set_timeout = not self._owns_engine
        if isinstance(engine, str):
            engine = make_engine(engine, lock_timeout_s, pool_size)
        self.engine: Engine = engine
        install_sqlite_begin(engine)
        self.table = entity_table(
            engine, table, create=create, id_column=id_column, version_column=version_column
        )
        self.id_column, self.version_column = id_column, version_column
        self.on_conflict = on_conflict
        self.retry_on = (VersionConflict,)
        self.max_attempts = 1 + max_retries if on_conflict == "retry" else 1
        self.expected_version = expected_version
        self.entity_id = entity_id or (lambda job: job.key)
        self.lock_timeout_ms = int(lock_timeout_s * 1000)
        t = self.table
        self._read = sa.select(t).where(t.c[id_column] == sa.bindparam("id"))
        self._rows = BatchRows(t, id_column, engine, lock=False)
        dialect = engine.dialect.name
        # not MySQL's INSERT IGNORE: it also turns other errors (truncation) into warnings
        self._insert_new = (
            insert_ignore(t, dialect).returning(t.c[id_column])
            if dialect in ("postgresql", "sqlite")
            else None
        )
        self._string_ids = isinstance(t.c[id_column].type, sa.String)
        self._warned = False

    def __repr__(self) -> str:
        url = self.engine.url.render_as_string(hide_password=True)
        return f"OptimisticVersion({url}, table={self.table.name}, on_conflict={self.on_conflict})"

    def open_transaction(self) -> Connection:
        conn = self.engine.connect()
        try:
            conn.begin()
            if self._set_timeout:
                set_lock_timeout(conn, self.lock_timeout_ms)
        except BaseException:
            close_quietly(conn)
            raise
        return conn

    def read_row(self, conn: Connection, entity: Any) -> Row | None:
        return conn.execute(self._read, {"id": entity}).mappings().first()

    def read_rows(self, conn: Connection, entities: list[Any]) -> dict[Any, Row | None]:
        """A batch's rows in one statement. An id with no row is answered "no row" only
        when ids and the column are both strings: otherwise the database may normalise
        an id (another type), and that one is read at its turn."""
        found: dict[Any, Row | None] = dict(self._rows.read(conn, entities))
        if self._string_ids and all(isinstance(e, str) for e in entities):
            for entity in entities:
                found.setdefault(entity, None)
        return found

    def ticket(self, job: Job, conn: Connection, entity: Any, row: Row | None) -> Ticket:
        version = None if row is None else int(row[self.version_column])
        verdict, detail = self._check_expected(job.message, version)
        if not verdict.runs:
            return Ticket(job, verdict, detail=detail, private=conn)
        data = None if row is None else dict(row)
        handle = Versioned(
            conn,
            self.table,
            self.id_column,
            self.version_column,
            entity,
            data,
            version,
            insert_new=self._insert_new,
        )
        return Ticket(job, Verdict.RUN, handle=handle, atomic=True, private=conn)

    def begin(self, job: Job) -> Ticket:
        return begin_alone(self, job)

    def session(self, jobs: Sequence[Job]) -> BatchSession | None:
        """The batch in one transaction: its rows read in one statement, a savepoint per
        message (a conflict retried re-reads inside it), one COMMIT
        (:class:`~idemp.strategies._entity_batch.EntityBatch`)."""
        return EntityBatch(self, jobs) if len(jobs) >= 2 else None

    def _check_expected(self, message: Message, current: int | None) -> tuple[Verdict, str]:
        if self.expected_version is None:
            return Verdict.RUN, ""
        expected = self.expected_version(message)
        if expected is None:
            return Verdict.RUN, ""
        have = 0 if current is None else current
        if have > expected:
            return Verdict.STALE, f"built against version {expected}, row is at {have}"
        if have < expected:
            return Verdict.IN_PROGRESS, f"ahead: built against version {expected}, row at {have}"
        return Verdict.RUN, ""

    def committed(self, ticket: Ticket) -> None:
        """A handler succeeded (alone or in a batch): say once if it left the version."""
        handle = ticket.handle
        if (
            self.expected_version is not None
            and isinstance(handle, Versioned)
            and handle.updates == 0
            and not self._warned
        ):
            # Nothing else would say it: the version did not move, so a redelivery or a
            # producer retry built against the same version runs the handler again.
            self._warned = True
            log.warning(
                "%s: a handler committed without ctx.handle.update() or insert(): the "
                "row's version did not move, so redeliveries of its messages will run "
                "again (said once)",
                self.table.name,
            )

    def commit(self, ticket: Ticket) -> None:
        self.committed(ticket)
        commit_and_close(ticket.private)

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        close_quietly(ticket.private)  # rollback: the handler's writes go with it

    def classify(self, error: BaseException) -> Outcome | None:
        if isinstance(error, VersionConflict):
            # drop: stale by policy. retry: retries exhausted, the row is hot; come back.
            return Outcome.DROPPED if self.on_conflict == "drop" else Outcome.IN_PROGRESS
        if busy(error):
            return Outcome.IN_PROGRESS
        if store_failure(error):
            return Outcome.STORE_ERROR
        return None

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()
