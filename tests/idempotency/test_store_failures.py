"""Store failures mid-run: every error becomes "reconsume later" (or, after an applied
non-transactional effect, an ack reported as a commit error); no effect lost or doubled."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from idemp import Context, Message, Outcome, ack_of, idempotent, stats
from tests.idempotency.effects import Effects

NS = "fail-group/Orders"


def _msg(key: str) -> Message:
    return Message("Orders", b"{}", keys=(key,), msg_id=f"m-{key}")


def _drain(handle: Any, keys: list[str], rounds: int = 5) -> dict[str, list[Outcome]]:
    """Deliver until acked, like a broker: unacked messages come back (bounded rounds)."""
    seen: dict[str, list[Outcome]] = {k: [] for k in keys}
    pending = list(keys)
    for _ in range(rounds):
        retry = []
        for key in pending:
            result = handle(_msg(key))
            seen[key].append(result.outcome)
            if not ack_of(result):
                retry.append(key)
        pending = retry
    assert pending == []
    return seen


def test_redis_down_and_restarted_mid_run(
    make_strategy: Any, redis_server: Any, postgres_server: Any
):
    strategy, spec = make_strategy("redis")
    effects = Effects(spec, postgres_server.url)
    name = f"redis-down-{spec['name']}"
    keys = [f"k{i}" for i in range(40)]

    @idempotent(key="keys", strategy=strategy, namespace=NS, name=name)
    def handle(message: Message, ctx: Context) -> None:
        effects.apply(message, ctx)
        if message.keys[0] == "k30":  # the store dies between the effect and the commit
            redis_server.stop()

    first = {k: handle(_msg(k)).outcome for k in keys[:20]}
    assert set(first.values()) == {Outcome.PROCESSED}
    redis_server.stop()
    down = handle(_msg("k20"))
    assert down.outcome is Outcome.STORE_ERROR and ack_of(down) is False
    redis_server.start()
    committed_blind = handle(_msg("k30"))  # effect applied, then Redis went away
    assert committed_blind.outcome is Outcome.PROCESSED and ack_of(committed_blind) is True
    assert stats(name)["commit_errors"] == 1
    redis_server.start()
    rest = _drain(handle, [k for k in keys[20:] if k != "k30"])

    assert all(v[-1] is Outcome.PROCESSED for v in rest.values())
    assert effects.counts() == dict.fromkeys(keys, 1)
    assert stats(name)["store_errors"] == 1
    effects.close()


def test_postgres_connection_dropped_inside_transaction(make_strategy: Any, postgres_server: Any):
    strategy, spec = make_strategy("pg_tx")
    effects = Effects(spec, postgres_server.url)
    killer = sa.create_engine(postgres_server.url, isolation_level="AUTOCOMMIT")
    kill = ["k3"]

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        effects.apply(message, ctx)
        if message.keys[0] in kill:
            kill.remove(message.keys[0])
            pid = ctx.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            with killer.connect() as conn:
                conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")

    seen = _drain(handle, [f"k{i}" for i in range(6)])

    assert seen["k3"] == [Outcome.STORE_ERROR, Outcome.PROCESSED]
    assert effects.counts() == {f"k{i}": 1 for i in range(6)}
    killer.dispose()
    effects.close()


def test_postgres_restarted_mid_run(make_strategy: Any, postgres_server: Any):
    strategy, spec = make_strategy("pg")
    effects = Effects(spec, postgres_server.url)

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        effects.apply(message, ctx)

    assert handle(_msg("p1")).outcome is Outcome.PROCESSED
    postgres_server.stop()
    try:
        down = handle(_msg("p2"))
    finally:
        postgres_server.start()
    assert down.outcome is Outcome.STORE_ERROR and ack_of(down) is False
    seen = _drain(handle, ["p1", "p2", "p3"])

    assert seen == {
        "p1": [Outcome.DUPLICATE],
        "p2": [Outcome.PROCESSED],
        "p3": [Outcome.PROCESSED],
    }
    assert effects.counts() == {"p1": 1, "p2": 1, "p3": 1}
    effects.close()
