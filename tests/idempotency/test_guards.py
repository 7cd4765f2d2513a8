"""State-machine guards: the ride-hailing order machine, a shuffled stream of 1,000 orders'
transitions with redeliveries, and the guard composed with every strategy."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from idemp import ConsumeResult, Context, Message, Outcome, ack_of, guarded, stats
from idemp.guards import (
    RIDE_HAILING_ORDER,
    CallableStateStore,
    Decision,
    SqlStateStore,
    StateMachine,
)
from idemp.strategies import (
    OptimisticVersion,
    PessimisticRowLock,
    RedisFlag,
    RedissonLock,
    Strategy,
    UniqueKeyTable,
)
from tests.idempotency.rides import order_msg, ride_guarded

PATH = [
    "created",
    "driver_assigned",
    "driver_departed",
    "driver_arrived",
    "passenger_picked_up",
    "arrived",
]
EXPECTED = list(zip([None, *PATH[:-1]], PATH))


def test_machine_decisions() -> None:
    m = RIDE_HAILING_ORDER
    assert m.terminal == {"arrived"} and m.initial == {"created"}
    assert m.decide(None, "created") is Decision.APPLY
    assert m.decide(None, "driver_arrived") is Decision.AHEAD
    assert m.decide("created", "driver_assigned") is Decision.APPLY
    assert m.decide("created", "created") is Decision.DUPLICATE
    assert m.decide("driver_arrived", "driver_assigned") is Decision.STALE
    assert m.decide("created", "passenger_picked_up") is Decision.AHEAD
    assert m.decide("arrived", "created") is Decision.DISALLOWED
    assert m.decide("created", "teleported") is Decision.DISALLOWED
    branching = StateMachine(
        "b", {"new": ["paid", "cancelled"], "paid": ["shipped"]}, initial="new"
    )
    assert branching.decide("cancelled", "paid") is Decision.DISALLOWED
    assert branching.decide("paid", "cancelled") is Decision.DISALLOWED  # another branch
    with pytest.raises(ValueError):
        StateMachine("bad", {"a": ["b"]}, initial="a", terminal=["a"])


def _log_table(engine: sa.Engine, name: str) -> sa.Table:
    table = sa.Table(
        name,
        sa.MetaData(),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("entity", sa.String(64), nullable=False),
        sa.Column("source", sa.String(64)),
        sa.Column("target", sa.String(64), nullable=False),
    )
    table.metadata.create_all(engine)
    return table


def _applied(engine: sa.Engine, log: sa.Table) -> dict[str, list[tuple[str | None, str]]]:
    out: dict[str, list[tuple[str | None, str]]] = collections.defaultdict(list)
    with engine.connect() as conn:
        for _seq, entity, source, target in conn.execute(sa.select(log).order_by(log.c.seq)):
            out[entity].append((source, target))
    return dict(out)


def _deliver_all(handle: Callable[[Message], Any], stream: list[Message], threads: int) -> Any:
    """Deliver like the broker: a message answered "reconsume later" comes back at the end
    of the queue with ``reconsume_times + 1``. Bounded: 10 rounds of the whole stream."""
    queue = collections.deque(stream)
    lock = threading.Lock()
    outcomes: collections.Counter[Outcome] = collections.Counter()
    budget = [10 * len(stream)]

    def worker() -> None:
        while True:
            with lock:
                if not queue or budget[0] <= 0:
                    return
                budget[0] -= 1
                m = queue.popleft()
            result = handle(m)
            with lock:
                outcomes[result.outcome] += 1
                if not ack_of(result):
                    queue.append(dataclasses.replace(m, reconsume_times=m.reconsume_times + 1))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(120)
    assert not queue, f"{len(queue)} messages never acked"
    return outcomes


@pytest.mark.parametrize("kind,threads", [("sqlite", 1), ("pg", 4)])
def test_shuffled_stream_of_1000_orders(
    kind: str, threads: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'orders.db'}"
        if kind == "sqlite"
        else request.getfixturevalue("postgres_server").url
    )
    suffix = uuid.uuid4().hex[:8]
    store = SqlStateStore(url, table=f"orders_{suffix}")
    log = _log_table(store.engine, f"applied_{suffix}")
    name = f"rides-{suffix}"

    @ride_guarded(
        store,
        max_holds=8,
        name=name,
    )
    def on_transition(message: Message, ctx: Context) -> None:
        t = ctx.transition
        assert t is not None
        ctx.connection.execute(
            sa.insert(log), {"entity": t.entity, "source": t.source, "target": t.target}
        )

    rng = random.Random(4)
    orders = [f"o{i:04d}" for i in range(1000)]
    originals = [order_msg(o, s) for o in orders for s in PATH]
    redeliveries = rng.sample(originals, 1200)  # same content again (broker or producer)
    bogus = [order_msg(o, "teleported") for o in rng.sample(orders, 50)]
    stream = originals + redeliveries + bogus
    rng.shuffle(stream)

    outcomes = _deliver_all(on_transition, stream, threads)

    assert store.states() == dict.fromkeys(orders, "arrived")
    applied = _applied(store.engine, log)
    assert applied == dict.fromkeys(orders, EXPECTED)  # exact sequence, nothing else
    assert outcomes[Outcome.PROCESSED] == len(originals)
    assert outcomes[Outcome.DROPPED] == len(redeliveries) + len(bogus)
    assert outcomes[Outcome.HELD] > 0
    assert set(outcomes) == {Outcome.PROCESSED, Outcome.DROPPED, Outcome.HELD}
    counted = stats(name)
    assert counted["guard_drops"] == len(redeliveries) + len(bogus)
    assert counted["held"] == outcomes[Outcome.HELD]
    store.close()


def test_held_past_max_holds_then_policy(tmp_path: Path) -> None:
    """After ``max_holds`` holds the default keeps the message (to the group's DLQ);
    dropping it is an explicit choice."""
    states: dict[str, str] = {}

    def save(entity: str, source: str | None, target: str) -> bool:
        if states.get(entity) != source:
            return False
        states[entity] = target
        return True

    store = CallableStateStore(load=states.get, save=save)
    retry, dlq = ConsumeResult.RECONSUME_LATER, ConsumeResult.DEAD_LETTER
    policies: list[tuple[dict[str, str], Outcome, ConsumeResult]] = [
        ({}, Outcome.DEAD_LETTERED, dlq),  # the default
        ({"after_holds": "dead_letter"}, Outcome.DEAD_LETTERED, dlq),
        ({"after_holds": "drop"}, Outcome.DROPPED, ConsumeResult.SUCCESS),
        ({"after_holds": "reconsume"}, Outcome.HELD, retry),
    ]
    for n, (option, last, last_result) in enumerate(policies):
        name = f"holds-{n}-{uuid.uuid4().hex[:6]}"

        @ride_guarded(
            store,
            max_holds=2,
            name=name,
            **option,
        )
        def handle(message: Message) -> None:
            return None

        ahead = order_msg(f"x-{n}", "driver_assigned")
        got = [handle(dataclasses.replace(ahead, reconsume_times=k)) for k in range(3)]
        assert [r.outcome for r in got] == [Outcome.HELD, Outcome.HELD, last]
        assert [r.consume_result for r in got] == [retry, retry, last_result]
        assert ack_of(got[2]) is (last_result is ConsumeResult.SUCCESS)
        counted = stats(name)
        assert counted["held"] == 2 + (last is Outcome.HELD)
        assert counted["dead_lettered"] == (last is Outcome.DEAD_LETTERED)
        assert counted["guard_drops"] == (last is Outcome.DROPPED)
    assert states == {}


def test_after_holds_checked_when_declared() -> None:
    store = CallableStateStore(load=lambda e: None, save=lambda e, s, t: True)
    with pytest.raises(ValueError, match="after_holds='forget': expected one of dead_letter"):
        guarded(
            RIDE_HAILING_ORDER,
            entity="json:order",
            target="json:state",
            store=store,
            after_holds="forget",
        )
    with pytest.raises(ValueError, match="max_holds=-1: expected 0 or more"):
        guarded(
            RIDE_HAILING_ORDER, entity="json:order", target="json:state", store=store, max_holds=-1
        )


STRATEGIES = ["none", "unique_key", "unique_key_tx", "redis_flag", "optimistic", "pessimistic"]


@pytest.mark.parametrize("kind", [*STRATEGIES, "redisson"])
def test_guard_composes_with_every_strategy(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'compose.db'}"
    strategy: Strategy | None = None
    if kind in ("redis_flag", "redisson"):
        redis_url = request.getfixturevalue("redis_server").url
        prefix = uuid.uuid4().hex[:8]
        strategy = (
            RedisFlag(redis_url, prefix=prefix)
            if kind == "redis_flag"
            else RedissonLock(redis_url, prefix=prefix)
        )
    elif kind.startswith("unique_key"):
        strategy = UniqueKeyTable(url, transactional=kind.endswith("_tx"))
    elif kind == "optimistic":
        strategy = OptimisticVersion(url)
    elif kind == "pessimistic":
        strategy = PessimisticRowLock(url)
    store = SqlStateStore(url)
    log = _log_table(store.engine, "applied")

    @ride_guarded(
        store,
        strategy=strategy,
        name=f"compose-{kind}",
    )
    def on_transition(message: Message, ctx: Context) -> None:
        t = ctx.transition
        assert t is not None
        ctx.connection.execute(
            sa.insert(log), {"entity": t.entity, "source": t.source, "target": t.target}
        )

    rng = random.Random(7)
    orders = [f"c{i}" for i in range(20)]
    originals = [order_msg(o, s) for o in orders for s in PATH]
    stream = originals + rng.sample(originals, 40)
    rng.shuffle(stream)

    outcomes = _deliver_all(on_transition, stream, 1)

    assert store.states() == dict.fromkeys(orders, "arrived")
    assert _applied(store.engine, log) == dict.fromkeys(orders, EXPECTED)
    assert outcomes[Outcome.PROCESSED] == len(originals)
    # a redelivery is absorbed by the claim (DUPLICATE) or by the guard (DROPPED)
    assert outcomes[Outcome.DROPPED] + outcomes[Outcome.DUPLICATE] == 40
    if strategy is not None:
        strategy.close()
    store.close()


async def _deliver_all_async(
    handle: Callable[[Message], Any], stream: list[Message], tasks: int
) -> collections.Counter[Outcome]:
    """``_deliver_all`` for an ``async def`` listener: ``tasks`` concurrent deliveries on
    one event loop; "reconsume later" goes back to the end of the queue. Bounded."""
    queue = collections.deque(stream)
    outcomes: collections.Counter[Outcome] = collections.Counter()
    budget = [10 * len(stream)]

    async def worker() -> None:
        while queue and budget[0] > 0:  # no await between the check and the pop
            budget[0] -= 1
            m = queue.popleft()
            result = await handle(m)
            outcomes[result.outcome] += 1
            if not ack_of(result):
                queue.append(dataclasses.replace(m, reconsume_times=m.reconsume_times + 1))

    await asyncio.gather(*(worker() for _ in range(tasks)))
    assert not queue, f"{len(queue)} messages never acked"
    return outcomes


@pytest.mark.parametrize("kind,tasks", [("sqlite", 1), ("pg", 4)])
def test_async_guarded_listener(
    kind: str, tasks: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``async def`` under @guarded: the same guard steps as the sync path, the state load
    and save off the event loop. On PostgreSQL composed with a transactional unique-key
    table (the state, the claim and the handler's row in one transaction); one handler
    failure rolls back its transition, and the redelivery applies it once."""
    url = (
        f"sqlite:///{tmp_path / 'async.db'}"
        if kind == "sqlite"
        else request.getfixturevalue("postgres_server").url
    )
    suffix = uuid.uuid4().hex[:8]
    store = SqlStateStore(url, table=f"async_orders_{suffix}")
    log = _log_table(store.engine, f"async_applied_{suffix}")
    strategy = (
        UniqueKeyTable(url, table=f"async_dedup_{suffix}", transactional=True)
        if kind == "pg"
        else None
    )
    name = f"async-rides-{suffix}"
    fail_once = {("a0003", "driver_departed")}
    loop_threads: set[int] = set()

    @ride_guarded(
        store,
        strategy=strategy,
        max_holds=8,
        name=name,
    )
    async def on_transition(message: Message, ctx: Context) -> None:
        await asyncio.sleep(0)
        loop_threads.add(threading.get_ident())
        t = ctx.transition
        assert t is not None
        ctx.connection.execute(
            sa.insert(log), {"entity": t.entity, "source": t.source, "target": t.target}
        )
        if (t.entity, t.target) in fail_once:
            fail_once.discard((t.entity, t.target))
            raise RuntimeError("downstream failed after the write")

    rng = random.Random(11)
    orders = [f"a{i:04d}" for i in range(100)]
    originals = [order_msg(o, s) for o in orders for s in PATH]
    redeliveries = rng.sample(originals, 120)
    stream = originals + redeliveries
    rng.shuffle(stream)

    outcomes = asyncio.run(_deliver_all_async(on_transition, stream, tasks))

    assert loop_threads == {threading.get_ident()}  # the handler ran on the loop's thread
    assert fail_once == set()
    assert store.states() == dict.fromkeys(orders, "arrived")
    assert _applied(store.engine, log) == dict.fromkeys(orders, EXPECTED)  # failed one undone
    assert outcomes[Outcome.PROCESSED] == len(originals)
    assert outcomes[Outcome.FAILED] == 1
    # a redelivery is absorbed by the claim (DUPLICATE) or by the guard (DROPPED)
    assert outcomes[Outcome.DROPPED] + outcomes[Outcome.DUPLICATE] == len(redeliveries)
    assert set(outcomes) <= {
        Outcome.PROCESSED,
        Outcome.DROPPED,
        Outcome.DUPLICATE,
        Outcome.HELD,
        Outcome.FAILED,
        Outcome.IN_PROGRESS,
    }
    if strategy is not None:
        strategy.close()
    store.close()
