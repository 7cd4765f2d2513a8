"""The business side of the tests: a table of applied effects, counted per key."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from idemp import Context, Message
from tests.idempotency.specs import IN_TRANSACTION, effects_table, effects_url


class Effects:
    """Applies one effect per handled message: a row in a business table with no unique
    key, so a doubled effect is two rows. In transactional mode the row is written through
    ``ctx.connection`` (the dedup record's transaction); otherwise through its own engine."""

    def __init__(self, spec: dict[str, Any], pg_url: str | None = None, worker: str = "main"):
        self.transactional = spec["kind"] in IN_TRANSACTION
        self.table = effects_table(f"{spec['name']}_effects")
        self.engine = sa.create_engine(effects_url(spec, pg_url), pool_pre_ping=True)
        self.table.metadata.create_all(self.engine, checkfirst=True)
        self.worker = worker

    def apply(self, message: Message, ctx: Context) -> None:
        row = {"business_key": ctx.key, "worker": self.worker}
        if self.transactional:
            ctx.connection.execute(sa.insert(self.table), row)
        else:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(self.table), row)

    def seen(self, key: str) -> bool:
        """Whether ``key``'s effect exists (for check-then-act under a lock)."""
        t = self.table
        with self.engine.connect() as conn:
            return bool(
                conn.execute(sa.select(sa.func.count()).where(t.c.business_key == key)).scalar()
            )

    def counts(self) -> dict[str, int]:
        t = self.table
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.business_key, sa.func.count()).group_by(t.c.business_key)
            ).all()
        return {k: int(n) for k, n in rows}

    def close(self) -> None:
        self.engine.dispose()
