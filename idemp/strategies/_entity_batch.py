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

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from idemp.strategies._sql import (
    DriverStatement,
    Savepoints,
    SizedStatements,
    busy,
    close_quietly,
    insert_ignore,
)
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


class BatchRows:
    """The statements that create and read (and lock) a batch's rows. On PostgreSQL the
    ids go as one array (``unnest``): one SQL text whatever the batch size,
    prepared once by psycopg; an ``IN`` list is a new text for every size (a batch's
    locking read measured ~8 ms that way). Elsewhere an ``IN`` list of bound ids and an
    executemany INSERT, compiled once per batch size and run on the driver's cursor
    (``DriverStatement``)."""

    def __init__(
        self, table: sa.Table, id_column: str, engine: Engine, *, lock: bool, nowait: bool = False
    ) -> None:
        self.id_column = id_column
        col = table.c[id_column]
        dialect = engine.dialect.name
        self.arrays = dialect == "postgresql"
        self.sized: SizedStatements | None = None
        self.insert_one: DriverStatement | None = None
        ids: Any
        if self.arrays:
            from sqlalchemy.dialects.postgresql import ARRAY
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            ids = sa.bindparam("ids", type_=ARRAY(col.type))
            # One index probe per id, in the array's order, whatever the statistics:
            # ``id = ANY($1)`` let the planner choose a scan of the whole table while
            # the table was new and not yet analyzed (autovacuum's first ANALYZE comes
            # within a minute), and psycopg's prepared statement kept that plan as the
            # table grew: a batch's read cost grew with the table (20,000 messages: 612
            # scans, 6 million rows read, ~300 µs of the server's CPU per message). A
            # LATERAL subquery that locks (FOR UPDATE), or that has an OFFSET, is not
            # flattened into a join, so each id is its own lookup by primary key.
            wanted = sa.func.unnest(ids).table_valued("want").render_derived("wanted")
            each: Any = sa.select(table).where(col == wanted.c.want)
            each = each.with_for_update(nowait=nowait) if lock else each.offset(0)
            each = each.lateral("found")
            read = sa.select(each).select_from(wanted).join(each, sa.true())
            self.insert: Any = (
                pg_insert(table)
                .from_select([id_column], sa.select(sa.func.unnest(ids)))
                .on_conflict_do_nothing()
            )
        else:
            read = sa.select(table).where(col.in_(sa.bindparam("ids", expanding=True)))
            self.insert = insert_ignore(table, dialect)
            if self.insert is not None:
                self.insert_one = DriverStatement(self.insert, engine, [id_column])

            def read_of(size: int) -> Any:
                listed = sa.select(table).where(
                    col.in_([sa.bindparam(f"id_{i}") for i in range(size)])
                )
                return listed.order_by(col).with_for_update(nowait=nowait) if lock else listed

            self.sized = SizedStatements(read_of, engine)
            if lock:
                read = read.order_by(col).with_for_update(nowait=nowait)
        self.read_statement = read

    def create(self, conn: Connection, entities: list[Any]) -> bool:
        """Insert the missing rows (in the order given); False: this database has no
        INSERT that ignores an existing key, the caller creates them one by one."""
        if self.insert is None:
            return False
        if self.arrays:
            conn.execute(self.insert, {"ids": entities})
        else:
            assert self.insert_one is not None
            self.insert_one.run_many(conn, [{self.id_column: e} for e in entities])
        return True

    def read(self, conn: Connection, entities: list[Any]) -> dict[Any, Row]:
        listed = self.sized.get(len(entities)) if self.sized is not None else None
        rows: Sequence[Row]
        if listed is not None:
            rows = listed.mappings(conn, {f"id_{i}": e for i, e in enumerate(entities)})
        else:
            rows = conn.execute(self.read_statement, {"ids": entities}).mappings().all()
        return {row[self.id_column]: row for row in rows}


def in_id_order(entities: list[Any]) -> list[Any]:
    """The order rows are taken in; ids of mixed types stay as they came."""
    try:
        return sorted(entities)
    except TypeError:
        return entities


def begin_alone(strategy: EntityStrategy, job: Job) -> Ticket:
    """One message on its own: its own transaction, its row read (pessimistic: locked),
    its ticket; a verdict not to run gives the transaction back at once."""
    entity = strategy.entity_id(job)
    conn: Connection | None = None
    try:
        conn = strategy.open_transaction()
        row = strategy.read_row(conn, entity)
    except SQLAlchemyError as exc:
        if conn is not None:
            close_quietly(conn)
        if busy(exc):
            return Ticket(job, Verdict.IN_PROGRESS, detail=f"{entity!r} is locked")
        raise StoreError(f"read of {entity!r} failed: {exc}") from exc
    ticket = strategy.ticket(job, conn, entity, row)
    if not ticket.verdict.runs:
        close_quietly(conn)
    return ticket


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
        rows = self.savepoints.attempt(
            "idemp_ahead", lambda: self.strategy.read_rows(self.conn, entities)
        )
        self.ahead = rows or {}

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

    def connection(self) -> Any:
        return self.conn
