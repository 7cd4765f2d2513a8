"""Strategy specs shared by the tests and their worker processes (``workers.py``).

A spec is a small JSON-able dict, so a child process builds the very same strategy:
``{"kind": "sqlite"|"sqlite_tx"|"pg"|"pg_tx"|"redis", "url": ..., "name": ...,
"deadline_s": ...}``; ``name`` is the table (SQL) or key prefix (Redis) private to a test.
Around-the-handler kinds: ``pg_optimistic``, ``pg_pessimistic`` (the business row in
table ``name``), ``redisson`` (a Redis lock; the effects in PostgreSQL).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from idemp.strategies import (
    OptimisticVersion,
    PessimisticRowLock,
    RedisFlag,
    RedissonLock,
    Strategy,
    UniqueKeyTable,
)

KINDS = ("sqlite", "sqlite_tx", "pg", "pg_tx", "redis")
#: Kinds whose handler writes through ``ctx.connection`` (the strategy's transaction).
IN_TRANSACTION = ("sqlite_tx", "pg_tx", "pg_optimistic", "pg_pessimistic")


def build(spec: dict[str, Any]) -> Strategy:
    kind = spec["kind"]
    deadline = float(spec.get("deadline_s", 30.0))
    if kind == "redis":
        return RedisFlag(spec["url"], prefix=spec["name"], deadline_s=deadline)
    if kind == "redisson":
        return RedissonLock(spec["url"], prefix=spec["name"], wait_s=5.0)
    timeout = float(spec.get("lock_timeout_s", 5.0))
    if kind == "pg_optimistic":  # every message was built against version 0 (no row)
        return OptimisticVersion(
            spec["url"], table=spec["name"], expected_version=lambda m: 0, lock_timeout_s=timeout
        )
    if kind == "pg_pessimistic":
        return PessimisticRowLock(spec["url"], table=spec["name"], lock_timeout_s=timeout)
    return UniqueKeyTable(
        spec["url"],
        table=spec["name"],
        deadline_s=deadline,
        transactional=kind.endswith("_tx"),
        lock_timeout_s=float(spec.get("lock_timeout_s", 5.0)),
    )


def effects_table(name: str) -> sa.Table:
    """The business table: one row per applied effect, deliberately without a unique key
    so that a doubled effect shows up as two rows."""
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("business_key", sa.String(255), nullable=False),
        sa.Column("worker", sa.String(64), nullable=False),
    )


def effects_url(spec: dict[str, Any], pg_url: str | None) -> str:
    """Where the effects go: the strategy's own database for SQL (the same transaction in
    transactional mode), PostgreSQL for Redis."""
    if spec["kind"] in ("redis", "redisson"):
        assert pg_url is not None
        return pg_url
    return str(spec["url"])
