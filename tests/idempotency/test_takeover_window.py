"""The window between a taker's read and its takeover (issue 12 §4).

On PostgreSQL the claim reads the record and takes it over in two statements. A holder
past its deadline that commits in between must win: the takeover is conditional on the
state it read (CONSUMING, deadline passed), not on the owner alone. A trigger holds the
taker's UPDATE until the holder has committed, so the interleaving is forced, not hoped
for.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from idemp import Context, Message, Outcome, idempotent
from idemp.strategies import CONSUMED, Job, UniqueKeyTable, Verdict

NS = "orders-group/Orders"


def _msg(key: str) -> Message:
    return Message("Orders", b"{}", keys=(key,), msg_id=f"id-{time.monotonic_ns()}")


def _hold_taker_until_consumed(engine: sa.Engine, table: str) -> None:
    """A statement trigger: an UPDATE from the connection named 'taker' waits (up to 20 s)
    until the record is CONSUMED, i.e. until the holder has committed."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"""
            CREATE FUNCTION {table}_hold() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF current_setting('application_name') = 'taker' THEN
                FOR i IN 1..2000 LOOP
                  EXIT WHEN EXISTS (SELECT 1 FROM {table} WHERE status = 'CONSUMED');
                  PERFORM pg_sleep(0.01);
                END LOOP;
              END IF;
              RETURN NULL;
            END $$;
            CREATE TRIGGER {table}_hold BEFORE UPDATE ON {table}
              FOR EACH STATEMENT EXECUTE FUNCTION {table}_hold();
            """
        )


def _taker_waiting(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = 'taker' AND wait_event = 'PgSleep'"
            ).scalar()
        )


def test_holder_committing_between_takers_read_and_update_wins(
    make_spec: Any, postgres_server: Any
) -> None:
    spec = make_spec("pg")
    table = spec["name"]
    holder_side = UniqueKeyTable(spec["url"], table=table, deadline_s=0.2)
    taker_side = UniqueKeyTable(
        spec["url"] + "?application_name=taker", table=table, deadline_s=0.2
    )
    try:
        runs: list[str] = []
        holder = holder_side.begin(Job(NS, "o-1", _msg("o-1")))
        assert holder.verdict is Verdict.RUN
        runs.append("holder")  # the holder's handler: slow, it overruns its deadline
        time.sleep(0.3)  # past the 0.2 s deadline on the store's clock (0.1 s margin)
        _hold_taker_until_consumed(holder_side.engine, table)

        @idempotent(key="keys", strategy=taker_side, namespace=NS, name=f"window-{table}")
        def handle(message: Message, ctx: Context) -> None:
            runs.append("taker")

        results: list[Any] = []
        taker = threading.Thread(target=lambda: results.append(handle(_msg("o-1"))))
        taker.start()
        # The taker has read the expired claim and sits in its UPDATE's trigger.
        for _ in range(1000):
            if _taker_waiting(holder_side.engine):
                break
            time.sleep(0.01)
        else:
            pytest.fail("the taker never reached its takeover UPDATE")
        holder_side.commit(holder)  # the late holder commits: its claim is still its own
        taker.join(30)

        assert runs == ["holder"]
        assert [r.outcome for r in results] == [Outcome.DUPLICATE]
        record = holder_side.get(NS, "o-1")
        assert record is not None and record.status == CONSUMED
        assert record.owner == holder.token and record.attempts == 1
    finally:
        holder_side.close()
        taker_side.close()
