"""UniqueKeyTable.purge on SQLite and PostgreSQL: expired rows only, in bounded batches
(each its own short transaction), by the indexed expiry."""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa

from idemp import Message
from idemp.strategies import Job, UniqueKeyTable

NS = "purge-group/Orders"


def consume(strategy: UniqueKeyTable, keys: list[str]) -> None:
    tickets = [strategy.begin(Job(NS, k, Message("Orders", b"{}", keys=(k,)))) for k in keys]
    for ticket in tickets:
        strategy.commit(ticket)


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
def test_purge_deletes_only_expired_rows_in_batches(kind: str, make_spec: Any) -> None:
    spec = make_spec(kind)
    short = UniqueKeyTable(spec["url"], table=spec["name"], retention_s=1.0)
    long = UniqueKeyTable(spec["url"], table=spec["name"], retention_s=86400.0, create=False)
    consume(short, [f"s{i:02d}" for i in range(25)])
    consume(long, [f"l{i:02d}" for i in range(5)])
    later = int(time.time() * 1000) + 60_000  # past the short retention, within the long

    assert short.purge(batch_size=10, max_batches=1, now_ms=later) == 10
    assert short.purge(batch_size=10, now_ms=later) == 15
    assert short.purge(batch_size=10, now_ms=later) == 0

    with short.engine.connect() as conn:
        left = conn.execute(sa.select(short.table.c.business_key)).scalars().all()
    assert sorted(left) == [f"l{i:02d}" for i in range(5)]
    assert "expires_ms" in {
        c for ix in sa.inspect(short.engine).get_indexes(spec["name"]) for c in ix["column_names"]
    }
    short.close()
    long.close()
