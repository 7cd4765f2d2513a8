"""Each strategy against its real store: SQLite and PostgreSQL (plain and transactional),
Redis. The protocol from DESIGN.md "The idempotency contract", case by case."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from idemp import Context, Message, Outcome, ack_of, idempotent, stats
from idemp.message import ConsumeResult
from idemp.strategies import (
    CONSUMED,
    CONSUMING,
    ClaimLost,
    ClaimStrategy,
    Job,
    UniqueKeyTable,
    Verdict,
)
from tests.idempotency.effects import Effects
from tests.idempotency.specs import KINDS

NS = "orders-group/Orders"
NON_TX = ("sqlite", "pg", "redis")

Maker = Callable[..., Any]


def msg(key: str, body: bytes = b'{"n": 1}', msg_id: str = "") -> Message:
    return Message("Orders", body, keys=(key,), msg_id=msg_id or f"id-{key}-{time.monotonic_ns()}")


@pytest.fixture
def effects_for(request: pytest.FixtureRequest) -> Iterator[Callable[[dict[str, Any]], Effects]]:
    made: list[Effects] = []

    def factory(spec: dict[str, Any]) -> Effects:
        pg = request.getfixturevalue("postgres_server").url if spec["kind"] == "redis" else None
        effects = Effects(spec, pg)
        made.append(effects)
        return effects

    yield factory
    for e in made:
        e.close()


def listener(strategy: Any, effects: Effects, name: str, **options: Any) -> Any:
    @idempotent(key="keys", strategy=strategy, namespace=NS, name=name, **options)
    def handle(message: Message, ctx: Context) -> None:
        effects.apply(message, ctx)

    return handle


@pytest.mark.parametrize("kind", KINDS)
def test_new_key_then_duplicate_with_new_msg_id(kind: str, make_strategy: Maker, effects_for: Any):
    strategy, spec = make_strategy(kind)
    effects = effects_for(spec)
    handle = listener(strategy, effects, f"dup-{spec['name']}")

    first = handle(msg("o-1", msg_id="A"))
    second = handle(msg("o-1", msg_id="B"))  # a producer retry: same key, new msgId

    assert (first.outcome, second.outcome) == (Outcome.PROCESSED, Outcome.DUPLICATE)
    assert (ack_of(first), ack_of(second)) == (True, True)
    assert effects.counts() == {"o-1": 1}
    record = strategy.get(NS, "o-1")
    assert record is not None and record.status == CONSUMED and record.attempts == 1
    counted = stats(f"dup-{spec['name']}")
    assert (counted["processed"], counted["duplicates"]) == (1, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_in_progress_is_reconsumed_later_never_acked(
    kind: str, make_strategy: Maker, effects_for: Any
):
    strategy, spec = make_strategy(kind, lock_timeout_s=0.3)
    effects = effects_for(spec)
    entered, release = threading.Event(), threading.Event()

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def slow(message: Message, ctx: Context) -> None:
        effects.apply(message, ctx)
        entered.set()
        assert release.wait(10), "the test never released the handler"

    results: list[Any] = []
    holder = threading.Thread(target=lambda: results.append(slow(msg("o-2"))))
    holder.start()
    try:
        assert entered.wait(10)
        during = slow(msg("o-2"))
    finally:
        release.set()
        holder.join(10)
    after = slow(msg("o-2"))

    assert during.outcome is Outcome.IN_PROGRESS
    assert during.consume_result is ConsumeResult.RECONSUME_LATER and ack_of(during) is False
    assert results[0].outcome is Outcome.PROCESSED
    assert after.outcome is Outcome.DUPLICATE
    assert effects.counts() == {"o-2": 1}


@pytest.mark.parametrize("kind", NON_TX)
def test_takeover_past_deadline_has_one_winner(kind: str, make_strategy: Maker, effects_for: Any):
    deadline = 0.5
    strategy, spec = make_strategy(kind, deadline_s=deadline)
    assert isinstance(strategy, ClaimStrategy)
    effects = effects_for(spec)
    name = f"takeover-{spec['name']}"
    handle = listener(strategy, effects, name)
    # A holder that claimed and then went silent (its process hung or died).
    stale = strategy.begin(Job(NS, "o-3", msg("o-3")))
    assert stale.verdict is Verdict.RUN

    early = handle(msg("o-3"))
    assert early.outcome is Outcome.IN_PROGRESS
    # The deadline is wall time on the store's clock: wait it out (bounded, 0.3 s margin).
    time.sleep(deadline + 0.3)

    barrier = threading.Barrier(8)
    outcomes: list[Outcome] = []
    takeovers: list[bool] = []

    def deliver() -> None:
        barrier.wait(10)
        result = handle(msg("o-3"))
        outcomes.append(result.outcome)
        takeovers.append(result.takeover)

    threads = [threading.Thread(target=deliver) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert outcomes.count(Outcome.PROCESSED) == 1
    assert takeovers.count(True) == 1
    assert set(outcomes) <= {Outcome.PROCESSED, Outcome.IN_PROGRESS, Outcome.DUPLICATE}
    assert effects.counts() == {"o-3": 1}
    record = strategy.get(NS, "o-3")
    assert record is not None and record.status == CONSUMED and record.attempts == 2
    assert stats(name)["takeovers"] == 1
    with pytest.raises(ClaimLost):  # the silent holder wakes up: its claim is gone
        strategy.commit(stale)


@pytest.mark.parametrize("kind", KINDS)
def test_handler_exception_releases_claim_and_redelivery_has_one_effect(
    kind: str, make_strategy: Maker, effects_for: Any
):
    strategy, spec = make_strategy(kind)
    effects = effects_for(spec)
    failures = [RuntimeError("downstream timeout")]

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def flaky(message: Message, ctx: Context) -> None:
        effects.apply(message, ctx)  # in transactional mode this write is rolled back
        if failures:
            raise failures.pop()

    failed = flaky(msg("o-4"))
    assert failed.outcome is Outcome.FAILED and ack_of(failed) is False
    assert isinstance(failed.error, RuntimeError)
    assert strategy.get(NS, "o-4") is None  # released: nothing blocks the redelivery
    redelivered = flaky(msg("o-4"))
    assert redelivered.outcome is Outcome.PROCESSED
    expected = 1 if kind.endswith("_tx") else 2  # a non-transactional effect is not undone
    assert effects.counts() == {"o-4": expected}
    assert flaky(msg("o-4")).outcome is Outcome.DUPLICATE


@pytest.mark.parametrize("kind", ("sqlite", "redis"))
def test_declining_listener_is_released_and_reconsumed(kind: str, make_strategy: Maker):
    strategy, _ = make_strategy(kind)
    answers = [ConsumeResult.RECONSUME_LATER, None]

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message) -> Any:
        return answers.pop(0)

    first, second = handle(msg("o-5")), handle(msg("o-5"))
    assert (first.outcome, ack_of(first)) == (Outcome.FAILED, False)
    assert (second.outcome, ack_of(second)) == (Outcome.PROCESSED, True)


@pytest.mark.parametrize("kind", KINDS)
def test_payload_conflict_is_reported_not_run(kind: str, make_strategy: Maker, effects_for: Any):
    strategy, spec = make_strategy(kind)
    effects = effects_for(spec)
    name = f"fp-{spec['name']}"
    handle = listener(strategy, effects, name, fingerprint=True)

    first = handle(msg("o-6", b'{"amount": 10}'))
    same = handle(msg("o-6", b'{"amount": 10}'))
    other = handle(msg("o-6", b'{"amount": 99}'))

    assert [r.outcome for r in (first, same, other)] == [
        Outcome.PROCESSED,
        Outcome.DUPLICATE,
        Outcome.PAYLOAD_CONFLICT,
    ]
    assert ack_of(other) is True  # retrying cannot change the stored body
    assert "stored fingerprint" in other.detail
    assert effects.counts() == {"o-6": 1}
    assert stats(name)["payload_conflicts"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_batch_claims_and_commits_together(kind: str, make_strategy: Maker, effects_for: Any):
    strategy, spec = make_strategy(kind)
    effects = effects_for(spec)
    seen: list[list[str]] = []

    @idempotent.batch(key="keys", strategy=strategy, namespace=NS)
    def handle(messages: list[Message], contexts: list[Context]) -> None:
        seen.append([m.keys[0] for m in messages])
        for m, c in zip(messages, contexts):
            effects.apply(m, c)

    assert handle([msg("b-1")]).consume_result is ConsumeResult.SUCCESS
    batch = [msg(k) for k in ("b-1", "b-2", "b-3", "b-2", "b-4")]
    result = handle(batch)

    assert [r.outcome for r in result.results] == [
        Outcome.DUPLICATE,
        Outcome.PROCESSED,
        Outcome.PROCESSED,
        Outcome.DUPLICATE,  # the same key twice in one batch: run once
        Outcome.PROCESSED,
    ]
    assert ack_of(result) is True
    assert seen == [["b-1"], ["b-2", "b-3", "b-4"]]
    assert effects.counts() == {"b-1": 1, "b-2": 1, "b-3": 1, "b-4": 1}
    for key in ("b-2", "b-3", "b-4"):
        record = strategy.get(NS, key)
        assert record is not None and record.status == CONSUMED


@pytest.mark.parametrize("kind", ("sqlite", "pg", "redis"))
def test_batch_failure_releases_every_claim(kind: str, make_strategy: Maker):
    strategy, _ = make_strategy(kind)
    fail = [True]

    @idempotent.batch(key="keys", strategy=strategy, namespace=NS)
    def handle(messages: list[Message]) -> None:
        if fail:
            fail.pop()
            raise ValueError("bad batch")

    first = handle([msg("c-1"), msg("c-2")])
    assert ack_of(first) is False and first.count(Outcome.FAILED) == 2
    assert strategy.get(NS, "c-1") is None and strategy.get(NS, "c-2") is None
    second = handle([msg("c-1"), msg("c-2")])
    assert ack_of(second) is True and second.count(Outcome.PROCESSED) == 2


@pytest.mark.parametrize("kind", ("sqlite_tx", "redis"))
def test_async_listener(kind: str, make_strategy: Maker, effects_for: Any):
    strategy, spec = make_strategy(kind)
    effects = effects_for(spec)

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    async def handle(message: Message, ctx: Context) -> None:
        await asyncio.sleep(0)
        effects.apply(message, ctx)

    async def run() -> list[Outcome]:
        return [(await handle(msg("a-1"))).outcome, (await handle(msg("a-1"))).outcome]

    assert asyncio.run(run()) == [Outcome.PROCESSED, Outcome.DUPLICATE]
    assert effects.counts() == {"a-1": 1}


def test_claiming_record_shape_on_redis(make_strategy: Maker):
    strategy, _ = make_strategy("redis", deadline_s=30)
    ticket = strategy.begin(Job(NS, "r-1", msg("r-1"), fingerprint="abc"))
    record = strategy.get(NS, "r-1")
    assert record is not None
    assert (record.status, record.owner, record.fingerprint) == (CONSUMING, ticket.token, "abc")
    assert record.deadline_ms is not None
    assert 28_000 < record.deadline_ms - int(time.time() * 1000) <= 30_000
    strategy.abort(ticket, None)
    assert strategy.get(NS, "r-1") is None


def test_redis_batch_over_several_script_calls_and_after_a_script_flush(make_strategy: Maker):
    """300 keys: more than one batch script call (128 keys each), with duplicates and a
    key in progress among them, right after the server lost its scripts (as after a
    restart): the batch scripts are loaded again and every key gets its own verdict."""
    strategy, _ = make_strategy("redis")
    keys = [f"m{i:03d}" for i in range(300)]
    strategy.commit_many(strategy.begin_many([Job(NS, k, msg(k)) for k in keys[:100]]))
    held = strategy.begin(Job(NS, keys[100], msg(keys[100])))
    strategy.client.script_flush()

    tickets = strategy.begin_many([Job(NS, k, msg(k)) for k in keys])

    verdicts = [t.verdict for t in tickets]
    assert verdicts == [Verdict.DUPLICATE] * 100 + [Verdict.IN_PROGRESS] + [Verdict.RUN] * 199
    strategy.client.script_flush()
    strategy.commit_many([t for t in tickets if t.verdict.runs])
    for k in keys[101:]:
        record = strategy.get(NS, k)
        assert record is not None and record.status == CONSUMED
    strategy.abort_many([held], None)
    assert strategy.get(NS, keys[100]) is None


def test_redis_batch_is_one_owner_a_repeated_key_claimed_once_and_fingerprints_kept(
    make_strategy: Maker,
):
    """A batch claims under one owner token. A key given twice in one call is claimed once
    (the repeat is in progress, not run twice); fingerprints, sent only when a job has
    one, are stored per key; commits and releases grouped by owner when tickets of two
    batches come back together."""
    strategy, _ = make_strategy("redis")
    jobs = [
        Job(NS, "f-1", msg("f-1"), "fp-1"),
        Job(NS, "f-2", msg("f-2")),
        Job(NS, "f-1", msg("f-1"), "fp-1"),
    ]
    first = strategy.begin_many(jobs)
    assert [t.verdict for t in first] == [Verdict.RUN, Verdict.RUN, Verdict.IN_PROGRESS]
    assert first[0].token == first[1].token
    second = strategy.begin_many([Job(NS, "f-3", msg("f-3")), Job(NS, "f-4", msg("f-4"))])
    assert second[0].token != first[0].token

    strategy.commit_many([first[0], second[0], first[1]])  # two owners in one call
    strategy.abort_many([second[1]], None)

    stored = {k: strategy.get(NS, k) for k in ("f-1", "f-2", "f-3", "f-4")}
    assert stored["f-4"] is None
    assert {k: (r.status, r.fingerprint) for k, r in stored.items() if r} == {
        "f-1": (CONSUMED, "fp-1"),
        "f-2": (CONSUMED, None),
        "f-3": (CONSUMED, None),
    }
    assert stored["f-1"].owner == stored["f-2"].owner != stored["f-3"].owner
    conflict = strategy.begin_many([Job(NS, "f-1", msg("f-1"), "fp-other")])
    assert [t.verdict for t in conflict] == [Verdict.PAYLOAD_CONFLICT]


@pytest.mark.parametrize("kind", ["sqlite", "pg"])
def test_sql_batch_commit_marks_its_own_claims_and_names_those_taken_over(
    kind: str, make_strategy: Maker
) -> None:
    """The autocommit table's batch commit: each record of the batch marked CONSUMED only
    where this batch still owns the claim; one taken over meanwhile (another owner's
    token now) is left as it is, the others commit, and the commit says how many were
    lost."""
    strategy, _ = make_strategy(kind)
    assert isinstance(strategy, UniqueKeyTable)
    keys = ["c-1", "c-2", "c-3"]
    tickets = strategy.begin_many([Job(NS, k, msg(k)) for k in keys])
    assert [t.verdict for t in tickets] == [Verdict.RUN] * 3
    t = strategy.table
    with strategy.engine.begin() as conn:  # another consumer took c-2 over
        conn.execute(sa.update(t).where(t.c.business_key == "c-2").values(owner="someone-else"))

    with pytest.raises(ClaimLost, match="^1 of 3 claims were taken over before commit$"):
        strategy.commit_many(tickets)

    records = {k: strategy.get(NS, k) for k in keys}
    assert {k: (r.status, r.owner) for k, r in records.items() if r} == {
        "c-1": (CONSUMED, tickets[0].token),
        "c-2": (CONSUMING, "someone-else"),
        "c-3": (CONSUMED, tickets[2].token),
    }


def test_pg_batch_commit_looks_each_record_up_by_key_on_a_new_table(
    make_strategy: Maker,
) -> None:
    """The batch commit's statement, prepared while the table is empty (as psycopg does
    at its sixth run, and a new deployment's first batches do) and kept as the table
    grows to 40,000 records without an ANALYZE, is planned as primary-key lookups, not
    as a scan of the table. (A row-value IN list was, once per batch.)"""
    strategy, _ = make_strategy("pg")
    assert isinstance(strategy, UniqueKeyTable)
    t = strategy.table
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool):
        if statement.lstrip().upper().startswith("UPDATE"):
            seen.append((statement, params[0] if many else params))

    sa.event.listen(strategy.engine, "before_cursor_execute", capture)
    try:
        keys = [f"n-{i}" for i in range(32)]
        strategy.commit_many(strategy.begin_many([Job(NS, k, msg(k)) for k in keys]))
    finally:
        sa.event.remove(strategy.engine, "before_cursor_execute", capture)
    assert [strategy.get(NS, k).status for k in keys] == [CONSUMED] * 32  # type: ignore[union-attr]
    assert len({s for s, _ in seen}) == 1, seen
    statement, params = seen[0]
    names = re.findall(r"%\((\w+)\)s", statement)
    prepared = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement)
    values = ", ".join(_literal(params[n]) for n in names)
    with strategy.engine.connect() as conn:
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE commit_batch AS {prepared}")
        conn.exec_driver_sql(f"EXPLAIN EXECUTE commit_batch({values})")  # planned now: empty
        conn.execute(t.insert().from_select(_COLUMNS, _old_records(40_000)))
        plan = "\n".join(
            r[0] for r in conn.exec_driver_sql(f"EXPLAIN EXECUTE commit_batch({values})")
        )
        assert (
            conn.execute(
                sa.text("SELECT reltuples FROM pg_class WHERE relname = :t"), {"t": t.name}
            ).scalar_one()
            == -1
        )  # never analyzed
        assert "Index Scan" in plan and "Seq Scan" not in plan, plan
        conn.rollback()


_COLUMNS = [
    "namespace",
    "business_key",
    "status",
    "owner",
    "attempts",
    "expires_ms",
    "created_ms",
    "updated_ms",
]


def _old_records(n: int) -> Any:
    return sa.select(
        sa.literal("old"),
        sa.literal("k") + sa.cast(sa.column("g"), sa.String),
        sa.literal(CONSUMED),
        sa.literal("o"),
        sa.literal(1),
        sa.literal(2**62),
        sa.literal(0),
        sa.literal(0),
    ).select_from(sa.func.generate_series(1, n).alias("g"))


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"
