"""Unique-key table (SQLAlchemy 2 Core): one row per (namespace, business key).

Claim = ``INSERT … ON CONFLICT DO NOTHING`` (PostgreSQL, SQLite; ``INSERT IGNORE`` on
MySQL): a row inserted is ours. Otherwise the row decides: CONSUMED → duplicate,
CONSUMING before its deadline → in progress, CONSUMING past it (or CONSUMED past its
retention) → a compare-and-set ``UPDATE … WHERE owner = :old AND status = :read AND
deadline passed`` that only one taker wins, and that a holder committing late defeats.

Two modes:

* default: each statement commits at once (autocommit): claim, handler, then
  ``UPDATE … SET status = 'CONSUMED' WHERE owner = :me``. A crash between the handler's
  effect and that update is the crash window; the deadline bounds how long it blocks.
* ``transactional=True``: the claim row (written directly as CONSUMED) and the handler's
  writes (through ``ctx.connection``) commit in one transaction; a crash rolls both back.
  A concurrent claimer of the same key waits on the row (up to ``lock_timeout_s``, then
  in progress) and then sees the committed row: a duplicate.

SQLite has no row locks: every write transaction here starts with ``BEGIN IMMEDIATE``
(the database-wide write lock) so that claims serialize instead of failing at commit.

The primary key is the unique (namespace, business_key) index: a claim is one index
lookup however large the table. ``expires_ms`` is indexed; ``purge()`` deletes expired
rows in small batches so that no statement holds locks for long.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from idemp.strategies._sql import (
    Savepoints,
    SizedStatements,
    commit_and_close,
    make_engine,
    valid_identifier,
)
from idemp.strategies._sql import busy as _busy
from idemp.strategies._sql import close_quietly as _close_quietly
from idemp.strategies._sql import install_sqlite_begin as _install_sqlite_begin
from idemp.strategies.base import (
    CONSUMED,
    CONSUMING,
    BatchSession,
    ClaimAheadSession,
    ClaimLost,
    ClaimStrategy,
    Job,
    Record,
    StoreError,
    Ticket,
    Verdict,
    new_token,
    verdict_of_existing,
)

KEY_LENGTH = 255
NAMESPACE_LENGTH = 255
_LONG_KEY = 200  # longer keys are stored as their hash (an index must stay bounded)
#: The columns a claim sets (``UniqueKeyTable._row``)
CLAIM_COLUMNS = (
    "namespace",
    "business_key",
    "status",
    "owner",
    "fingerprint",
    "attempts",
    "deadline_ms",
    "expires_ms",
    "msg_id",
    "created_ms",
    "updated_ms",
)


def _now_ms() -> int:
    return int(time.time() * 1000)


def stored_key(key: str) -> str:
    if len(key) <= _LONG_KEY:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def make_table(name: str, metadata: sa.MetaData | None = None) -> sa.Table:
    metadata = metadata if metadata is not None else sa.MetaData()
    return sa.Table(
        valid_identifier(name),
        metadata,
        sa.Column("namespace", sa.String(NAMESPACE_LENGTH), primary_key=True),
        sa.Column("business_key", sa.String(KEY_LENGTH), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, default=1),
        sa.Column("deadline_ms", sa.BigInteger, nullable=True),
        sa.Column("expires_ms", sa.BigInteger, nullable=False, index=True),
        sa.Column("msg_id", sa.String(64), nullable=True),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("updated_ms", sa.BigInteger, nullable=False),
    )


class UniqueKeyTable(ClaimStrategy):
    """``UniqueKeyTable("postgresql+psycopg://…")``, ``UniqueKeyTable("sqlite:///dedup.db")``
    or ``UniqueKeyTable(engine)``; ``table``, ``deadline_s``, ``retention_s``,
    ``transactional``, ``lock_timeout_s``, ``create`` (the table, if missing)."""

    name = "unique_key"

    def __init__(
        self,
        engine: str | Engine,
        *,
        table: str = "idemp_dedup",
        deadline_s: float = 60.0,
        retention_s: float = 7 * 86400.0,
        transactional: bool = False,
        lock_timeout_s: float = 5.0,
        create: bool = True,
        pool_size: int = 8,
    ) -> None:
        super().__init__(deadline_s=deadline_s, retention_s=retention_s)
        self._owns_engine = isinstance(engine, str)
        if isinstance(engine, str):
            # Not transactional: every statement stands alone, so the engine is made in
            # autocommit mode (no mode switch per checkout; the DDL and purge need none).
            engine = make_engine(engine, lock_timeout_s, pool_size, autocommit=not transactional)
        self.engine: Engine = engine
        self.dialect = engine.dialect.name
        self.table = make_table(table)
        self.transactional = transactional
        self.lock_timeout_ms = int(lock_timeout_s * 1000)
        if self.dialect == "sqlite":
            _install_sqlite_begin(engine)
            self._auto = engine
        elif self._owns_engine and not transactional:
            self._auto = engine  # made in autocommit mode
        else:
            # One round trip per statement: no BEGIN/COMMIT around single-row writes.
            self._auto = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._insert = self._insert_statement()
        if self.dialect in ("postgresql", "sqlite"):
            self._insert_returning = self._insert.returning(self.table.c.owner)
            # many rows: executed with a list of parameter sets, which SQLAlchemy sends as
            # one multi-row INSERT ("insertmanyvalues") from one compiled statement; a
            # ``.values(rows)`` statement is compiled afresh every time (~5 ms for 8 rows)
            self._insert_many = self._insert.returning(
                self.table.c.namespace, self.table.c.business_key
            )
        self._insert_unnest = self._unnest_statement() if self.dialect == "postgresql" else None
        # SQLite: a batch's claims as one multi-row INSERT … RETURNING compiled once per
        # batch size and run on the driver's cursor (SQLAlchemy's "insertmanyvalues"
        # rendered and executed it anew at every batch: ~10 % of a batch's CPU)
        self._insert_rows = (
            SizedStatements(self._claims_of, engine) if self.dialect == "sqlite" else None
        )
        self._read, self._claim_one_trip = self._claim_statements()
        self._mark_consumed, self._release_mine = self._finish_statements()
        if create:
            self.create()

    def __repr__(self) -> str:
        return (
            f"UniqueKeyTable({self.engine.url.render_as_string(hide_password=True)}, "
            f"table={self.table.name}, transactional={self.transactional})"
        )

    def create(self) -> None:
        try:
            self.table.metadata.create_all(self.engine, checkfirst=True)
        except IntegrityError:  # two processes created it at once
            pass
        except DBAPIError as exc:
            if "already exists" not in str(exc):
                raise StoreError(f"cannot create {self.table.name}: {exc}") from exc

    def _claim_statements(self) -> tuple[Any, Any]:
        """Built once (compiled once): the read of an existing record, and on PostgreSQL
        a single statement that inserts the claim or else returns the stored record."""
        t = self.table
        cols = (
            t.c.status,
            t.c.owner,
            t.c.fingerprint,
            t.c.attempts,
            t.c.deadline_ms,
            t.c.expires_ms,
        )
        read = sa.select(*cols).where(
            t.c.namespace == sa.bindparam("ns"), t.c.business_key == sa.bindparam("key")
        )
        if self.dialect != "postgresql":
            return read, None
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        values: dict[str, Any] = {c.name: sa.bindparam(c.name) for c in t.columns}
        ins = (
            pg_insert(t)
            .values(values)
            .on_conflict_do_nothing(index_elements=["namespace", "business_key"])
            .returning(*cols)
            .cte("ins")
        )
        mine = sa.select(sa.literal(1).label("mine"), *[ins.c[c.name] for c in cols])
        theirs = sa.select(sa.literal(0).label("mine"), *cols).where(
            t.c.namespace == sa.bindparam("namespace"),
            t.c.business_key == sa.bindparam("business_key"),
        )
        return read, sa.union_all(mine, theirs)

    def _unnest_statement(self) -> Any:
        """PostgreSQL: a batch's claims as arrays, one row each (``unnest``). The SQL is
        the same whatever the batch size, so psycopg converts and prepares it once; a
        multi-row VALUES of 32 claims is over its 4 KB statement cache and costs ~7 ms of
        parsing every time."""
        name = self.engine.dialect.identifier_preparer.format_table(self.table)
        return sa.text(
            f"INSERT INTO {name} (namespace, business_key, status, owner, fingerprint, "
            "attempts, deadline_ms, expires_ms, msg_id, created_ms, updated_ms) "
            "SELECT u.ns, u.k, :status, :owner, u.fp, 1, :deadline, :expires, u.mid, :now, "
            ":now FROM unnest(CAST(:nss AS varchar[]), CAST(:keys AS varchar[]), "
            "CAST(:fps AS varchar[]), CAST(:mids AS varchar[])) AS u(ns, k, fp, mid) "
            "ON CONFLICT (namespace, business_key) DO NOTHING "
            "RETURNING namespace, business_key"
        )

    def _insert_claims(
        self, conn: Connection, jobs: Sequence[Job], status: str
    ) -> tuple[str, set[tuple[str, str]]]:
        """Claims for distinct jobs in one statement, under one owner token: the token,
        and the (namespace, stored key) pairs inserted (the others exist already)."""
        token = new_token()
        now = _now_ms()
        if self._insert_unnest is not None:
            deadline = now + self.deadline_ms
            expires = (
                deadline + self.retention_ms if status == CONSUMING else now + self.retention_ms
            )
            params = {
                "nss": [j.namespace for j in jobs],
                "keys": [stored_key(j.key) for j in jobs],
                "fps": [j.fingerprint for j in jobs],
                "mids": [j.message.msg_id[:64] or None for j in jobs],
                "status": status,
                "owner": token,
                "deadline": deadline,
                "expires": expires,
                "now": now,
            }
            got = conn.execute(self._insert_unnest, params)
        else:
            values = [self._values(j, token, now, status) for j in jobs]
            sized = self._insert_rows.get(len(values)) if self._insert_rows is not None else None
            if sized is not None:
                got = sized.run_rows(conn, CLAIM_COLUMNS, values).fetchall()
            else:
                got = conn.execute(self._insert_many, [dict(zip(CLAIM_COLUMNS, v)) for v in values])
        return token, {(ns, k) for ns, k in got}

    def _claims_of(self, size: int) -> Any:
        """``size`` claims in one INSERT, each value its own named parameter."""
        t = self.table
        rows: list[dict[str, Any]] = [
            {c: sa.bindparam(f"{c}_{i}") for c in CLAIM_COLUMNS} for i in range(size)
        ]
        return self._insert.values(rows).returning(t.c.namespace, t.c.business_key)

    def _finish_statements(self) -> tuple[Any, Any]:
        """Built once: CONSUMING → CONSUMED and the release, both owner-only."""
        t = self.table
        mine = (
            t.c.namespace == sa.bindparam("ns"),
            t.c.business_key == sa.bindparam("key"),
            t.c.owner == sa.bindparam("me"),
        )
        consumed = (
            sa.update(t)
            .where(*mine)
            .values(
                status=CONSUMED,
                deadline_ms=None,
                expires_ms=sa.bindparam("expires"),
                updated_ms=sa.bindparam("now"),
            )
        )
        release = sa.delete(t).where(*mine, t.c.status == CONSUMING)
        # a batch transaction's own claim row (written CONSUMED), dropped when its
        # handler fails or never starts
        self._drop_mine = sa.delete(t).where(*mine)
        return consumed, release

    def _insert_statement(self) -> Any:
        t = self.table
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(t).on_conflict_do_nothing(index_elements=["namespace", "business_key"])
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            return sqlite_insert(t).on_conflict_do_nothing(
                index_elements=["namespace", "business_key"]
            )
        if self.dialect in ("mysql", "mariadb"):
            return sa.insert(t).prefix_with("IGNORE")
        return None  # other dialects: plain INSERT, a duplicate raises IntegrityError

    # -- claim ------------------------------------------------------------------------
    def _row(self, job: Job, token: str, now: int, status: str) -> dict[str, Any]:
        return dict(zip(CLAIM_COLUMNS, self._values(job, token, now, status)))

    def _values(self, job: Job, token: str, now: int, status: str) -> tuple[Any, ...]:
        """A claim row's values in ``CLAIM_COLUMNS`` order."""
        deadline = now + self.deadline_ms
        expires = deadline + self.retention_ms if status == CONSUMING else now + self.retention_ms
        return (
            job.namespace,
            stored_key(job.key),
            status,
            token,
            job.fingerprint,
            1,
            deadline,
            expires,
            job.message.msg_id[:64] or None,
            now,
            now,
        )

    def _try_insert(self, conn: Connection, row: dict[str, Any]) -> bool:
        if self._insert is None:
            try:
                with conn.begin_nested():
                    conn.execute(sa.insert(self.table), row)
                return True
            except IntegrityError:
                return False
        if self.dialect in ("postgresql", "sqlite"):
            # RETURNING, not rowcount: psycopg reports -1 for INSERT … ON CONFLICT here.
            return conn.execute(self._insert_returning, row).first() is not None
        return conn.execute(self._insert, row).rowcount == 1

    def _claim_on(self, conn: Connection, job: Job, status: str) -> Ticket:
        """The claim protocol on one connection (autocommit, or inside a transaction)."""
        t = self.table
        key = stored_key(job.key)
        for _ in range(3):  # a row purged or released between our statements: try again
            token = new_token()
            now = _now_ms()
            row = self._row(job, token, now, status)
            found: Any
            if self._claim_one_trip is not None:
                # PostgreSQL: insert-or-read in one round trip. The read shares the
                # statement's snapshot, so a row committed by a racer while our INSERT
                # waited is not seen: then nothing comes back and we go round again.
                got = conn.execute(self._claim_one_trip, row).first()
                if got is None:
                    continue
                if got[0] == 1:
                    return Ticket(job, Verdict.RUN, token)
                found = got[1:]
            else:
                if self._try_insert(conn, row):
                    return Ticket(job, Verdict.RUN, token)
                found = conn.execute(self._read, {"ns": job.namespace, "key": key}).first()
                if found is None:
                    continue
            st, owner, fp, attempts, deadline, expires = found
            expired = expires <= now
            if not expired:
                verdict = verdict_of_existing(
                    st, fp, job, deadline_passed=deadline is not None and deadline <= now
                )
                if verdict is not Verdict.TAKEOVER:
                    return Ticket(
                        job,
                        verdict,
                        attempts=attempts,
                        detail=f"stored fingerprint {fp}" if fp else "",
                    )
            row = self._row(job, token, now, status)
            # Compare-and-set on the state read, not on the owner alone: a holder that
            # commits after our read (PostgreSQL and MySQL re-check the WHERE on the row
            # as committed) turns the record CONSUMED and the takeover matches nothing.
            passed = t.c.expires_ms <= now if expired else t.c.deadline_ms <= now
            taken = conn.execute(
                sa.update(t)
                .where(
                    t.c.namespace == job.namespace,
                    t.c.business_key == key,
                    t.c.owner == owner,
                    t.c.status == st,
                    passed,
                )
                .values(
                    status=status,
                    owner=token,
                    fingerprint=job.fingerprint,
                    attempts=t.c.attempts + 1,
                    deadline_ms=row["deadline_ms"],
                    expires_ms=row["expires_ms"],
                    msg_id=row["msg_id"],
                    updated_ms=now,
                )
            ).rowcount
            if taken == 1:
                # An expired CONSUMED record is a new delivery after the retention; only
                # a CONSUMING one past its deadline is a takeover.
                verdict = Verdict.TAKEOVER if st == CONSUMING and not expired else Verdict.RUN
                return Ticket(job, verdict, token, attempts=attempts + 1)
            # The record changed since we read it (another taker won, or its holder
            # committed): read it again and decide on what it is now.
        return Ticket(job, Verdict.IN_PROGRESS, detail="record kept changing under the claim")

    def begin(self, job: Job) -> Ticket:
        if self.transactional:
            return self._begin_transaction(job)
        try:
            with self._auto.begin() as conn:
                return self._claim_on(conn, job, CONSUMING)
        except DBAPIError as exc:
            if _busy(exc):
                return Ticket(job, Verdict.IN_PROGRESS, detail="lock wait timed out")
            raise StoreError(f"claim failed: {exc.orig or exc}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"claim failed: {exc}") from exc

    def _open_transaction(self) -> Connection:
        """A connection in a transaction whose row-lock waits are bounded by
        ``lock_timeout_s`` (closed again if that fails)."""
        conn = self.engine.connect()
        try:
            conn.begin()
            if self.dialect == "postgresql":
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = {self.lock_timeout_ms}")
            elif self.dialect in ("mysql", "mariadb"):
                seconds = max(1, self.lock_timeout_ms // 1000)
                conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {seconds}")
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def _begin_transaction(self, job: Job) -> Ticket:
        conn: Connection | None = None
        try:
            conn = self._open_transaction()
            ticket = self._claim_on(conn, job, CONSUMED)
        except DBAPIError as exc:
            if conn is not None:
                _close_quietly(conn)
            if _busy(exc):
                return Ticket(job, Verdict.IN_PROGRESS, detail="lock wait timed out")
            raise StoreError(f"claim failed: {exc.orig or exc}") from exc
        except SQLAlchemyError as exc:
            if conn is not None:
                _close_quietly(conn)
            raise StoreError(f"claim failed: {exc}") from exc
        except BaseException:
            if conn is not None:
                _close_quietly(conn)
            raise
        if not ticket.verdict.runs:
            _close_quietly(conn)
            return ticket
        ticket.handle = conn
        ticket.atomic = True
        ticket.private = conn
        return ticket

    # -- commit / release -------------------------------------------------------------
    def commit(self, ticket: Ticket) -> None:
        if isinstance(ticket.private, _Shared):
            self.commit_many([ticket])
            return
        if ticket.private is not None:
            commit_and_close(ticket.private)
            return
        job = ticket.job
        now = _now_ms()
        params = {
            "ns": job.namespace,
            "key": stored_key(job.key),
            "me": ticket.token,
            "expires": now + self.retention_ms,
            "now": now,
        }
        try:
            with self._auto.begin() as auto:
                done = auto.execute(self._mark_consumed, params).rowcount
        except SQLAlchemyError as exc:
            raise StoreError(f"commit failed: {exc}") from exc
        if done != 1:
            raise ClaimLost(f"claim on {job.key!r} was taken over before commit")

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        if isinstance(ticket.private, _Shared):
            _close_quietly(ticket.private.conn)
            return
        if ticket.private is not None:
            _close_quietly(ticket.private)  # rollback: the claim row goes with it
            return
        job = ticket.job
        params = {"ns": job.namespace, "key": stored_key(job.key), "me": ticket.token}
        try:
            with self._auto.begin() as auto:
                auto.execute(self._release_mine, params)
        except SQLAlchemyError as exc:
            raise StoreError(f"release failed: {exc}") from exc

    # -- batches ----------------------------------------------------------------------
    def begin_many(self, jobs: Sequence[Job]) -> list[Ticket]:
        """One multi-row INSERT … ON CONFLICT DO NOTHING RETURNING for the whole batch
        (PostgreSQL, SQLite); the keys it did not insert go through the single-key path."""
        if self.transactional:
            return self._begin_transaction_many(jobs)
        if self.dialect not in ("postgresql", "sqlite") or len(jobs) < 2:
            return [self.begin(job) for job in jobs]
        ordered = sorted(jobs, key=lambda j: (j.namespace, stored_key(j.key)))  # lock order
        try:
            with self._auto.begin() as conn:
                token, inserted = self._insert_claims(conn, ordered, CONSUMING)
        except DBAPIError as exc:
            if _busy(exc):
                return [
                    Ticket(job, Verdict.IN_PROGRESS, detail="lock wait timed out") for job in jobs
                ]
            raise StoreError(f"batch claim failed: {exc.orig or exc}") from exc
        out = []
        for job in jobs:
            if (job.namespace, stored_key(job.key)) in inserted:
                out.append(Ticket(job, Verdict.RUN, token))
            else:
                out.append(self.begin(job))
        return out

    def _begin_transaction_many(self, jobs: Sequence[Job]) -> list[Ticket]:
        """Transactional batch: every claim and the handler's writes in one transaction."""
        conn: Connection | None = None
        try:
            conn = self._open_transaction()
            tickets = [self._claim_on(conn, job, CONSUMED) for job in jobs]
        except DBAPIError as exc:
            if conn is not None:
                _close_quietly(conn)
            if _busy(exc):
                return [Ticket(j, Verdict.IN_PROGRESS, detail="lock wait timed out") for j in jobs]
            raise StoreError(f"batch claim failed: {exc.orig or exc}") from exc
        except BaseException:
            if conn is not None:
                _close_quietly(conn)
            raise
        shared = _Shared(conn)
        for ticket in tickets:
            if ticket.verdict.runs:
                ticket.handle, ticket.atomic, ticket.private = conn, True, shared
        if not any(t.verdict.runs for t in tickets):
            _close_quietly(conn)
        return tickets

    def commit_many(self, tickets: Sequence[Ticket]) -> None:
        shared = {id(t.private): t.private for t in tickets if isinstance(t.private, _Shared)}
        if shared:
            for box in shared.values():
                try:
                    box.conn.commit()
                except SQLAlchemyError as exc:
                    raise StoreError(f"batch commit failed: {exc}") from exc
                finally:
                    _close_quietly(box.conn)
            return
        if self.transactional or len(tickets) < 2:
            for ticket in tickets:
                self.commit(ticket)
            return
        now = _now_ms()
        try:
            with self._auto.begin() as conn:
                # One UPDATE by primary key per record, in one transaction (psycopg
                # pipelines them into one round trip). A row-value IN list is planned as
                # a scan of the whole table by SQLite always, and by PostgreSQL on a
                # table not yet analyzed, a plan its prepared statement then kept: the
                # batch's commit grew with the table (PostgreSQL, 40,000 records: 913
                # scans, 23 million rows read; SQLite, 100,000: 3x the CPU).
                params = [
                    {
                        "ns": x.job.namespace,
                        "key": stored_key(x.job.key),
                        "me": x.token,
                        "expires": now + self.retention_ms,
                        "now": now,
                    }
                    for x in tickets
                ]
                done = conn.execute(self._mark_consumed, params).rowcount
        except SQLAlchemyError as exc:
            raise StoreError(f"batch commit failed: {exc}") from exc
        if done != len(tickets):
            raise ClaimLost(
                f"{len(tickets) - done} of {len(tickets)} claims were taken over before commit"
            )

    def session(self, jobs: Sequence[Job]) -> BatchSession | None:
        """Transactional: the batch in one transaction, a savepoint per message. Otherwise:
        the batch's keys claimed in one INSERT, marked CONSUMED in one UPDATE at the end."""
        if len(jobs) < 2:
            return None
        if self.transactional:
            return _TransactionSession(self, jobs)
        return ClaimAheadSession(self, jobs)

    # -- inspection and housekeeping --------------------------------------------------
    def get(self, namespace: str, key: str) -> Record | None:
        t = self.table
        try:
            with self.engine.connect() as conn:
                row = conn.execute(
                    sa.select(t).where(
                        t.c.namespace == namespace, t.c.business_key == stored_key(key)
                    )
                ).first()
        except SQLAlchemyError as exc:
            raise StoreError(f"read failed: {exc}") from exc
        if row is None:
            return None
        return Record(
            row.namespace,
            row.business_key,
            row.status,
            row.owner,
            row.fingerprint,
            row.attempts,
            row.deadline_ms,
            row.expires_ms,
        )

    def purge(
        self, *, batch_size: int = 1000, max_batches: int | None = None, now_ms: int | None = None
    ) -> int:
        """Delete expired rows, ``batch_size`` at a time, each batch its own short
        transaction (locks only the rows it deletes). Returns how many were deleted.

        PostgreSQL and SQLite: one statement per batch, ``DELETE … WHERE (namespace,
        business_key) IN (SELECT … WHERE expires_ms < :cutoff ORDER BY expires_ms LIMIT
        :n)`` (the expiry index, then one primary-key probe per row). Others (MySQL allows
        no LIMIT in such a subquery): select the batch's keys, then delete them. Either way
        the outer ``expires_ms < :cutoff`` is checked again on the row deleted, so a record
        claimed again meanwhile (a new expiry) is kept."""
        t = self.table
        cutoff = _now_ms() if now_ms is None else now_ms
        oldest = (
            sa.select(t.c.namespace, t.c.business_key)
            .where(t.c.expires_ms < cutoff)
            .order_by(t.c.expires_ms)
            .limit(batch_size)
        )
        one_statement = self.dialect in ("postgresql", "sqlite")
        total = 0
        batches = 0
        while max_batches is None or batches < max_batches:
            try:
                with self.engine.begin() as conn:
                    if one_statement:
                        keys = sa.tuple_(t.c.namespace, t.c.business_key)
                        deleted = conn.execute(
                            sa.delete(t).where(t.c.expires_ms < cutoff, keys.in_(oldest))
                        ).rowcount
                        found = deleted
                    else:
                        victims = conn.execute(oldest).all()
                        found = len(victims)
                        deleted = 0
                        if victims:
                            deleted = conn.execute(
                                sa.delete(t).where(
                                    t.c.expires_ms < cutoff,
                                    sa.tuple_(t.c.namespace, t.c.business_key).in_(
                                        [tuple(v) for v in victims]
                                    ),
                                )
                            ).rowcount
            except SQLAlchemyError as exc:
                raise StoreError(f"purge failed: {exc}") from exc
            total += deleted
            batches += 1
            if found < batch_size:
                break
        return total

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()


class _Shared:
    """The one transaction of a transactional batch, shared by its tickets."""

    __slots__ = ("conn",)

    def __init__(self, conn: Connection) -> None:
        self.conn = conn


class _TransactionSession(BatchSession):
    """One transaction for a runner's batch: one commit (one fsync) per batch instead
    of one per message. The batch's new keys are claimed in one multi-row INSERT (rows
    written CONSUMED, invisible to others until the commit; a concurrent claimer of the
    same key waits on the row and then finds a duplicate). Each message's handler and
    state writes run inside a savepoint, so a failed handler undoes only its own work,
    and its claim row is deleted. A second copy of a key reads the first copy's row in
    the same transaction: a duplicate (savepoints:
    :class:`~idemp.strategies._sql.Savepoints`)."""

    def __init__(self, strategy: UniqueKeyTable, jobs: Sequence[Job]) -> None:
        self.strategy = strategy
        try:
            conn = strategy._open_transaction()
        except SQLAlchemyError as exc:
            raise StoreError(f"batch transaction failed to start: {exc}") from exc
        self.conn = conn
        self.savepoints = Savepoints(conn)
        self._sql = self.savepoints.sql
        self.done: set[tuple[str, str]] = set()
        self.ahead: dict[int, Ticket] = self._claim_ahead(jobs)

    def _claim_ahead(self, jobs: Sequence[Job]) -> dict[int, Ticket]:
        """The batch's distinct keys in one INSERT … ON CONFLICT DO NOTHING RETURNING
        (PostgreSQL, SQLite), in a savepoint: a lock wait that times out (a key another
        batch holds) undoes only this, and every key is then claimed at its turn."""
        s = self.strategy
        firsts: dict[tuple[str, str], Job] = {}
        for job in jobs:
            firsts.setdefault((job.namespace, stored_key(job.key)), job)
        if s.dialect not in ("postgresql", "sqlite") or len(firsts) < 2:
            return {}
        # in key order: two batches claiming overlapping keys lock them in the same
        # order, so they wait for each other instead of deadlocking
        ordered = [firsts[ident] for ident in sorted(firsts)]
        claimed = self.savepoints.attempt(
            "idemp_ahead", lambda: s._insert_claims(self.conn, ordered, CONSUMED)
        )
        if claimed is None:
            return {}
        token, got = claimed
        out: dict[int, Ticket] = {}
        for ns, key in got:
            job = firsts[(ns, key)]
            out[id(job)] = Ticket(job, Verdict.RUN, token, self.conn, True, private=True)
        return out

    def begin(self, job: Job) -> Ticket:
        self.savepoints.next()
        ticket = self.ahead.pop(id(job), None)
        if ticket is not None:
            return ticket
        ident = (job.namespace, stored_key(job.key))
        if ident in self.done:
            return Ticket(job, Verdict.DUPLICATE, detail="repeated within the batch")
        try:
            ticket = self.strategy._claim_on(self.conn, job, CONSUMED)
        except SQLAlchemyError as exc:
            self.savepoints.undo()
            if isinstance(exc, DBAPIError) and _busy(exc):
                return Ticket(job, Verdict.IN_PROGRESS, detail="lock wait timed out")
            raise StoreError(f"claim failed: {exc}") from exc
        if not ticket.verdict.runs:
            return ticket  # nothing written: its savepoint goes with the next
        ticket.handle, ticket.atomic, ticket.private = self.conn, True, False
        return ticket

    def commit(self, ticket: Ticket) -> None:
        # kept: released with the next message's savepoint, or by the COMMIT
        self.done.add((ticket.job.namespace, stored_key(ticket.job.key)))

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        self.savepoints.undo()
        if ticket.private:  # claimed ahead, before the savepoint: drop the row too
            self._drop([ticket])

    def _drop(self, tickets: Sequence[Ticket]) -> None:
        params = [
            {"ns": t.job.namespace, "key": stored_key(t.job.key), "me": t.token} for t in tickets
        ]
        try:
            self.conn.execute(self.strategy._drop_mine, params)
        except SQLAlchemyError as exc:
            raise StoreError(f"release failed: {exc}") from exc

    def finish(self) -> None:
        unstarted = list(self.ahead.values())  # a stopping runner, an orderly failure
        self.ahead.clear()
        if unstarted:
            self._drop(unstarted)
        try:
            self.conn.commit()
        except SQLAlchemyError as exc:
            raise StoreError(f"batch commit failed: {exc}") from exc

    def close(self) -> None:
        _close_quietly(self.conn)

    def connection(self) -> Any:
        return self.conn
