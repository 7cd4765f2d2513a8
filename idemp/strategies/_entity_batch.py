"""A runner's batch on the "around" SQL strategies (pessimistic row lock, optimistic
version): one transaction instead of one per message.

The batch's entity rows are read (pessimistic: created if missing and locked) in one
statement before the first handler runs, in id order, so that two batches wanting the
same rows queue instead of deadlocking. Each message then runs in its own savepoint: a
failed handler (or a version conflict) undoes only its own writes, and a message whose
entity an earlier message of the batch already had reads the row again, so it sees that
message's writes exactly as it would after that message's commit on the single path.
One COMMIT makes the batch stick; until then nothing of it is visible to others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from idemp.strategies._sql import Savepoints, busy, close_quietly
from idemp.strategies.base import BatchSession, Job, StoreError, Ticket, Verdict

Row = Mapping[Any, Any]  # a RowMapping


class EntityStrategy(Protocol):
    """What the session needs of the strategy it batches for."""

    entity_id: Callable[[Job], Any]

    def open_transaction(self) -> Connection: ...

    def read_row(self, conn: Connection, entity: Any) -> Row | None: ...

    def read_rows(self, conn: Connection, entities: list[Any]) -> dict[Any, Row | None]: ...

    def ticket(self, job: Job, conn: Connection, entity: Any, row: Row | None) -> Ticket: ...

    def committed(self, ticket: Ticket) -> None: ...


def in_id_order(entities: list[Any]) -> list[Any]:
    """The order rows are taken in; ids of mixed types stay as they came."""
    try:
        return sorted(entities)
    except TypeError:
        return entities


class EntityBatch(BatchSession):
    def __init__(self, strategy: EntityStrategy, jobs: Sequence[Job]) -> None:
        self.strategy = strategy
        try:
            self.conn = strategy.open_transaction()
        except SQLAlchemyError as exc:
            raise StoreError(f"batch transaction failed to start: {exc}") from exc
        self.savepoints = Savepoints(self.conn)
        self.ahead: dict[Any, Row | None] = {}
        self.used: set[Any] = set()  # entities handed to a message of this batch
        try:
            entities = list(dict.fromkeys(strategy.entity_id(job) for job in jobs))
        except Exception:  # a user's entity_id that raises: each message says so at its turn
            entities = []
        if len(entities) >= 2:
            self._read_ahead(in_id_order(entities))

    def _read_ahead(self, entities: list[Any]) -> None:
        """In a savepoint: a lock wait that times out (rows another batch holds) undoes
        only this, and each message then reads its row at its turn."""
        sql = self.savepoints.sql
        sql("SAVEPOINT idemp_ahead")
        try:
            self.ahead = self.strategy.read_rows(self.conn, entities)
        except SQLAlchemyError:
            sql("ROLLBACK TO SAVEPOINT idemp_ahead")
            sql("RELEASE SAVEPOINT idemp_ahead")
            return
        sql("RELEASE SAVEPOINT idemp_ahead")

    def begin(self, job: Job) -> Ticket:
        strategy = self.strategy
        entity = strategy.entity_id(job)
        self.savepoints.next()
        try:
            if entity in self.ahead and entity not in self.used:
                row = self.ahead.pop(entity)
            else:
                row = strategy.read_row(self.conn, entity)
        except SQLAlchemyError as exc:
            self.savepoints.undo()
            if busy(exc):
                return Ticket(job, Verdict.IN_PROGRESS, detail=f"{entity!r} is locked")
            raise StoreError(f"read of {entity!r} failed: {exc}") from exc
        self.used.add(entity)
        return strategy.ticket(job, self.conn, entity, row)

    def commit(self, ticket: Ticket) -> None:
        self.strategy.committed(ticket)  # kept: the COMMIT at finish makes it stick

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        self.savepoints.undo()

    def finish(self) -> None:
        try:
            self.conn.commit()
        except SQLAlchemyError as exc:
            raise StoreError(f"batch commit failed: {exc}") from exc

    def close(self) -> None:
        close_quietly(self.conn)
