"""A runner's batch through a per-message decorated listener (``consume_batch``): one
transaction per batch (transactional unique-key table), the batch's claims in one
statement or script call (autocommit table, Redis flag); per-message outcomes as if
alone, on real SQLite, PostgreSQL and Redis."""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from idemp import Context, Message, Outcome, idempotent, stats
from idemp.guards import GuardConflict, SqlStateStore, Transition
from idemp.message import ConsumeResult, ack_of, consume_result_of
from idemp.outcome import Result
from idemp.strategies import CONSUMING, UniqueKeyTable
from tests.idempotency.effects import Effects
from tests.idempotency.rides import order_msg, ride_guarded
from tests.idempotency.specs import KINDS
from tests.realbroker import broker_of

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers

NS = "batch-group/Orders"
SESSIONS = KINDS  # every kind here has a batch session

Maker = Callable[..., Any]


def msg(key: str) -> Message:
    return Message("Orders", b"{}", keys=(key,), msg_id=f"id-{key}-{time.monotonic_ns()}")


@pytest.fixture
def effects_for(request: pytest.FixtureRequest) -> Iterator[Callable[[dict[str, Any]], Effects]]:
    made: list[Effects] = []

    def factory(spec: dict[str, Any]) -> Effects:
        pg = request.getfixturevalue("postgres_server").url if spec["kind"] == "redis" else None
        made.append(Effects(spec, pg))
        return made[-1]

    yield factory
    for e in made:
        e.close()


def peek(spec: dict[str, Any], strategy: Any, key: str) -> str | None:
    """A record's status as another reader sees it (a plain connection: the strategy's
    own SQLite engine would wait for the batch's write lock)."""
    if spec["kind"] == "redis":
        record = strategy.get(NS, key)
        return None if record is None else str(record.status)
    engine = sa.create_engine(spec["url"])
    t = sa.table(
        spec["name"], sa.column("status"), sa.column("namespace"), sa.column("business_key")
    )
    query = sa.select(t.c.status).where(t.c.namespace == NS, t.c.business_key == key)
    try:
        with engine.connect() as conn:
            return conn.execute(query).scalar()
    finally:
        engine.dispose()


def outcomes(results: list[Any]) -> list[Any]:
    return [r.outcome if isinstance(r, Result) else r for r in results]


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_decides_each_message_as_if_alone(
    kind: str, make_strategy: Maker, effects_for: Any
) -> None:
    strategy, spec = make_strategy(kind)
    effects = effects_for(spec)
    name = f"batch-{spec['name']}"
    during: dict[str, Any] = {}

    @idempotent(key="keys", strategy=strategy, namespace=NS, name=name)
    def handle(message: Message, ctx: Context) -> None:
        key = ctx.key
        if key == "x-3":
            raise ValueError("x-3 fails")
        effects.apply(message, ctx)
        if key == "x-4":  # what another connection sees while the batch is under way
            during["x-1 effect"] = effects.counts().get("x-1", 0)
            during["x-5 record"] = peek(spec, strategy, "x-5")

    assert handle(msg("x-0")).outcome is Outcome.PROCESSED
    keys = ["x-0", "x-1", "x-2", "x-3", "x-2", "x-4", "x-5"]
    results = handle.consume_batch([msg(k) for k in keys])

    assert outcomes(results) == [
        Outcome.DUPLICATE,  # consumed before the batch
        Outcome.PROCESSED,
        Outcome.PROCESSED,
        Outcome.FAILED,  # only this one comes back
        Outcome.DUPLICATE,  # x-2 again, after its first copy in this batch
        Outcome.PROCESSED,
        Outcome.PROCESSED,
    ]
    assert effects.counts() == {"x-0": 1, "x-1": 1, "x-2": 1, "x-4": 1, "x-5": 1}
    assert strategy.get(NS, "x-3") is None  # released: its redelivery runs
    assert stats(name)["processed"] == 5 and stats(name)["failures"] == 1
    if kind.endswith("_tx"):
        # one transaction: x-1's effect is not visible before the batch commits
        assert during == {"x-1 effect": 0, "x-5 record": None}
    else:
        # the batch's keys were claimed in one statement (script call) before the first
        # handler ran, each claim visible to other consumers at once
        assert during["x-1 effect"] == 1
        assert during["x-5 record"] == CONSUMING
    again = handle.consume_batch([msg("x-3"), msg("x-1")])
    assert outcomes(again) == [Outcome.FAILED, Outcome.DUPLICATE]


@pytest.mark.parametrize("kind", SESSIONS)
def test_an_orderly_batch_stops_at_its_first_failure(
    kind: str, make_strategy: Maker, effects_for: Any
) -> None:
    strategy, spec = make_strategy(kind)
    effects = effects_for(spec)

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> Any:
        if ctx.key == "o-2":
            return ConsumeResult.RECONSUME_LATER  # declined, not raised
        effects.apply(message, ctx)
        return None

    results = handle.consume_batch([msg("o-1"), msg("o-2"), msg("o-3")], stop_on_failure=True)

    assert outcomes(results) == [Outcome.PROCESSED, Outcome.FAILED]
    assert effects.counts() == {"o-1": 1}
    # o-3 was never started: no claim left behind to block its redelivery
    assert strategy.get(NS, "o-2") is None and strategy.get(NS, "o-3") is None


@pytest.mark.parametrize("kind", SESSIONS)
def test_a_stopping_runner_starts_nothing_more(
    kind: str, make_strategy: Maker, effects_for: Any
) -> None:
    strategy, spec = make_strategy(kind)
    effects = effects_for(spec)
    started: list[str] = []

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        started.append(ctx.key)
        effects.apply(message, ctx)

    results = handle.consume_batch(
        [msg("s-1"), msg("s-2"), msg("s-3")], stopping=lambda: len(started) >= 2
    )

    assert outcomes(results) == [Outcome.PROCESSED, Outcome.PROCESSED]
    assert effects.counts() == {"s-1": 1, "s-2": 1}
    assert strategy.get(NS, "s-2") is not None and strategy.get(NS, "s-3") is None


def test_a_missing_key_fails_only_its_own_message(make_strategy: Maker, effects_for: Any) -> None:
    strategy, spec = make_strategy("sqlite_tx")
    effects = effects_for(spec)

    @idempotent(key="keys", strategy=strategy, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        effects.apply(message, ctx)

    keyless = Message("Orders", b"{}", msg_id="no-key")
    results = handle.consume_batch([msg("m-1"), keyless, msg("m-2")])

    assert outcomes(results) == [
        Outcome.PROCESSED,
        ConsumeResult.RECONSUME_LATER,  # the default policy raises: the runner retries it
        Outcome.PROCESSED,
    ]
    assert effects.counts() == {"m-1": 1, "m-2": 1}


def test_a_batch_whose_commit_fails_comes_back_whole(postgres_server: Any) -> None:
    """A deferred constraint fails only at COMMIT: every processed message of the batch
    becomes a store error (reconsume later), and neither records nor effects remain."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(postgres_server.url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {name}_fx (v text, UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)"
        )
    strategy = UniqueKeyTable(postgres_server.url, table=name, transactional=True)

    @idempotent(key="keys", strategy=strategy, namespace=NS, name=name)
    def handle(message: Message, ctx: Context) -> None:
        ctx.connection.exec_driver_sql(f"INSERT INTO {name}_fx VALUES ('same')")

    try:
        results = handle.consume_batch([msg("d-1"), msg("d-2")])
        assert outcomes(results) == [Outcome.STORE_ERROR, Outcome.STORE_ERROR]
        assert [consume_result_of(r) for r in results] == [ConsumeResult.RECONSUME_LATER] * 2
        assert strategy.get(NS, "d-1") is None and strategy.get(NS, "d-2") is None
        with engine.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT count(*) FROM {name}_fx").scalar() == 0
        assert stats(name)["processed"] == 0 and stats(name)["store_errors"] == 2
    finally:
        strategy.close()
        engine.dispose()


PATH = ["created", "driver_assigned", "driver_departed", "driver_arrived"]


@pytest.mark.parametrize("transactional", [False, True])
def test_guards_hold_and_apply_inside_batches(transactional: bool, tmp_path: Path) -> None:
    """A shuffled stream of transitions with redeliveries, delivered in batches of 8: a
    transition ahead of its predecessor is held (it comes back), every transition is
    applied once, in order, per entity."""
    url = f"sqlite:///{tmp_path / 'guards.db'}"
    strategy = UniqueKeyTable(url, transactional=transactional)
    store = SqlStateStore(url)
    applied: list[tuple[str, str | None, str]] = []

    @ride_guarded(
        store,
        strategy=strategy,
        max_holds=50,
        after_holds="reconsume",
    )
    def on_transition(message: Message, ctx: Context) -> None:
        t = ctx.transition
        assert t is not None
        applied.append((t.entity, t.source, t.target))

    rng = random.Random(3)
    originals = [order_msg(f"e{i}", s) for i in range(6) for s in PATH]
    stream = originals + rng.sample(originals, 8)
    rng.shuffle(stream)
    queue = collections.deque(stream)
    counted: collections.Counter[Any] = collections.Counter()
    for _ in range(200):  # bounded: each round takes a batch of up to 8
        if not queue:
            break
        batch = [queue.popleft() for _ in range(min(8, len(queue)))]
        results = on_transition.consume_batch(batch)
        assert len(results) == len(batch)
        for m, r in zip(batch, results):
            counted[r.outcome] += 1
            if not ack_of(r):
                queue.append(dataclasses.replace(m, reconsume_times=m.reconsume_times + 1))
    assert not queue
    assert store.states() == {f"e{i}": "driver_arrived" for i in range(6)}
    per_entity: dict[str, list[tuple[str | None, str]]] = {}
    for entity, source, target in applied:
        per_entity.setdefault(entity, []).append((source, target))
    expected = list(zip([None, *PATH[:-1]], PATH))
    assert per_entity == {f"e{i}": expected for i in range(6)}
    assert counted[Outcome.PROCESSED] == len(originals)
    assert counted[Outcome.HELD] > 0  # the shuffle put successors first
    assert counted[Outcome.DUPLICATE] + counted[Outcome.DROPPED] == 8
    strategy.close()
    store.close()


@pytest.mark.parametrize("kind", SESSIONS)
def test_a_hold_whose_predecessor_comes_later_in_the_batch_is_applied_in_it(
    kind: str, make_strategy: Maker, tmp_path: Path
) -> None:
    """Transitions sent out of order that arrive in one concurrent batch: a held one is
    tried again, in the same batch, once a later message moved its entity (several
    rounds for a reversed chain); one whose predecessor is not in the batch stays held
    and is counted once. An orderly batch stops at its first hold instead."""
    strategy, spec = make_strategy(kind)
    states_url = f"sqlite:///{tmp_path / 'states.db'}" if kind == "redis" else spec["url"]
    store = SqlStateStore(states_url, table=f"{spec['name']}_state")
    name = f"redrive-{spec['name']}"
    applied: list[tuple[str, str]] = []

    @ride_guarded(
        store,
        strategy=strategy,
        name=name,
    )
    def on_transition(message: Message, ctx: Context) -> None:
        t = ctx.transition
        assert t is not None
        applied.append((t.entity, t.target))

    try:
        results = on_transition.consume_batch(
            [
                order_msg("r-1", "driver_departed"),
                order_msg("r-1", "driver_assigned"),
                order_msg("r-2", "driver_assigned"),  # r-2 was never created
                order_msg("r-1", "created"),
                order_msg("r-1", "driver_assigned"),  # a producer's retry of the second
                order_msg("r-3", "created"),
            ]
        )
        assert outcomes(results) == [
            Outcome.PROCESSED,  # tried again after the retry applied driver_assigned
            Outcome.DUPLICATE,  # tried again: its copy applied it meanwhile
            Outcome.HELD,  # comes back from the broker
            Outcome.PROCESSED,
            Outcome.PROCESSED,
            Outcome.PROCESSED,
        ]
        assert applied == [
            ("r-1", "created"),
            ("r-1", "driver_assigned"),
            ("r-3", "created"),
            ("r-1", "driver_departed"),
        ]
        assert stats(name)["held"] == 1 and stats(name)["processed"] == 4
        assert stats(name)["reordered"] == 1  # the first; the second became a duplicate

        applied.clear()
        reversed_chain = [
            order_msg("r-4", "driver_departed"),
            order_msg("r-4", "driver_assigned"),
            order_msg("r-4", "created"),
        ]
        assert outcomes(on_transition.consume_batch(reversed_chain)) == [Outcome.PROCESSED] * 3
        assert applied == [
            ("r-4", "created"),
            ("r-4", "driver_assigned"),
            ("r-4", "driver_departed"),
        ]
        assert stats(name)["reordered"] == 3

        applied.clear()  # past max_holds (16): dead-lettered only if the batch cannot help
        late = dataclasses.replace(order_msg("r-6", "driver_assigned"), reconsume_times=16)
        stuck = dataclasses.replace(order_msg("r-7", "driver_assigned"), reconsume_times=16)
        results = on_transition.consume_batch([late, stuck, order_msg("r-6", "created")])
        assert outcomes(results) == [
            Outcome.PROCESSED,
            Outcome.DEAD_LETTERED,
            Outcome.PROCESSED,
        ]
        assert results[1].to_dlq and not results[0].to_dlq
        assert applied == [("r-6", "created"), ("r-6", "driver_assigned")]
        assert stats(name)["dead_lettered"] == 1 and stats(name)["held"] == 1
        assert stats(name)["reordered"] == 4

        applied.clear()
        orderly = [order_msg("r-5", "driver_assigned"), order_msg("r-5", "created")]
        assert outcomes(on_transition.consume_batch(orderly, stop_on_failure=True)) == [
            Outcome.HELD
        ]
        assert applied == []
        assert stats(name)["held"] == 2
        # (a batch's transaction may have created empty state rows for its entities)
        assert {e: s for e, s in store.states().items() if s is not None} == {
            "r-1": "driver_departed",
            "r-3": "created",
            "r-4": "driver_departed",
            "r-6": "driver_assigned",
        }
    finally:
        store.close()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_batch_starts_a_transition_from_its_last_settled_save_only(
    database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """In a batch's transaction the state store hands an entity's next transition the
    state the last one saved, but only once the pipeline said that message committed
    (``settled``): a save whose message was undone, or a save refused, makes the next
    transition read the row again."""
    url = (
        f"sqlite:///{tmp_path / 'states.db'}"
        if database == "sqlite"
        else request.getfixturevalue("postgres_server").url
    )
    table = f"s_{uuid.uuid4().hex[:12]}"
    store = SqlStateStore(url, table=table)
    try:
        with store.engine.connect() as conn:
            conn.begin()
            store.preload(["a", "b"], conn)
            tx = store.open("a", conn)
            assert tx.state is None
            tx.save(Transition("a", None, "created"))
            store.settled(conn)  # its message committed into the batch
            assert store.open("a", conn).state == "created"

            undone = conn.begin_nested()  # the next message's savepoint
            store.open("a", conn).save(Transition("a", "created", "driver_assigned"))
            undone.rollback()  # its message undone: never settled
            assert store.open("a", conn).state == "created"  # the row, read again

            # b's row written behind the store's back (say, by a handler's own UPDATE)
            conn.execute(sa.text(f"UPDATE {table} SET state = 'created' WHERE id = 'b'"))
            tx = store.open("b", conn)
            assert tx.state is None  # as preloaded
            with pytest.raises(GuardConflict):  # the row is not where this one starts
                tx.save(Transition("b", None, "created"))
            store.settled(conn)  # nothing was saved: nothing to keep
            assert store.open("b", conn).state == "created"  # the row, read again
            store.unload(conn)
            conn.commit()
        assert store.states() == {"a": "created", "b": "created"}
    finally:
        store.close()


def test_a_guarded_batch_loads_and_locks_its_states_before_the_first_handler(
    postgres_server: Any,
) -> None:
    """In the batch's transaction, the state rows of all its entities are created and
    locked at once (another transaction cannot lock a later message's entity while the
    first handler runs); a second transition of an entity in the batch sees the first."""
    url = postgres_server.url
    name = f"t_{uuid.uuid4().hex[:12]}"
    strategy = UniqueKeyTable(url, table=name, transactional=True)
    store = SqlStateStore(url, table=f"{name}_state")
    other = sa.create_engine(url)
    seen: list[tuple[str, str | None, str]] = []
    during: list[str] = []

    @ride_guarded(
        store,
        strategy=strategy,
    )
    def on_transition(message: Message, ctx: Context) -> None:
        t = ctx.transition
        assert t is not None
        seen.append((t.entity, t.source, t.target))
        if not during:
            with other.connect() as conn:
                query = f"SELECT state FROM {name}_state WHERE id = 'g-2' FOR UPDATE NOWAIT"
                try:
                    conn.exec_driver_sql(query).all()
                    during.append("g-2 free")
                except sa.exc.OperationalError as exc:
                    during.append(type(exc.orig).__name__)

    try:
        during.append("before the batch")
        assert on_transition(order_msg("g-2", "created")).outcome is Outcome.PROCESSED
        during.clear()
        results = on_transition.consume_batch(
            [
                order_msg("g-1", "created"),
                order_msg("g-2", "driver_assigned"),
                order_msg("g-1", "driver_assigned"),
            ]
        )
        assert outcomes(results) == [Outcome.PROCESSED] * 3
        assert during == ["LockNotAvailable"]  # g-2's row: locked with g-1's, ahead
        assert seen == [
            ("g-2", None, "created"),
            ("g-1", None, "created"),
            ("g-2", "created", "driver_assigned"),
            ("g-1", "created", "driver_assigned"),  # saw the first g-1 of the batch
        ]
        assert store.states() == {"g-1": "driver_assigned", "g-2": "driver_assigned"}
    finally:
        strategy.close()
        store.close()
        other.dispose()


@pytest.mark.parametrize("orderly", [False, True])
def test_runners_hand_their_batches_to_the_listener(orderly: bool, tmp_path: Path) -> None:
    """idemp's runners with consume_batch_size 8 against idemp's broker: producer
    duplicates absorbed, a failing handler's message redelivered and applied once, the
    effects written in the batch's transaction; orderly: per-key order kept."""
    from idemp.client.producer import OutMessage, Producer
    from idemp.client.settings import ClientSettings, ConsumeFrom, ConsumerSettings
    from idemp.runners import ConcurrentRunner, OrderlyRunner
    from tests.client.conftest import FAST_DELAYS, wait_for

    keys, steps = 40, 3
    broker = broker_of(tmp_path / "store", {"messageDelayLevel": FAST_DELAYS}, HERE)
    broker.start()
    url = f"sqlite:///{tmp_path / 'app.db'}"
    strategy = UniqueKeyTable(url, transactional=True)
    effects = sa.Table(
        "fx",
        sa.MetaData(),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("k", sa.String(64)),
        sa.Column("step", sa.Integer),
    )
    engine = sa.create_engine(url)
    effects.create(engine)
    failed_once: list[str] = []
    batch_sizes: list[int] = []
    name = f"runner-batch-{orderly}"

    @idempotent(key="property:UID", strategy=strategy, group="g-batch", name=name)
    def handle(message: Message, ctx: Context) -> None:
        body = json.loads(message.body)
        if body["k"] == "k-7" and body["step"] == 1 and not failed_once:
            failed_once.append("k-7")
            raise RuntimeError("first attempt fails: the broker redelivers")
        ctx.connection.execute(sa.insert(effects), {"k": body["k"], "step": body["step"]})

    original = handle.consume_batch

    def counting(messages: Any, **options: Any) -> Any:
        batch_sizes.append(len(messages))
        return original(messages, **options)

    handle.consume_batch = counting
    producer = Producer(broker.namesrv_addr, "batch-producer").start()
    try:
        for step in range(steps):
            for i in range(keys):
                body = json.dumps({"k": f"k-{i}", "step": step}).encode()
                out = OutMessage("BatchOrders", body, properties={"UID": f"k-{i}.{step}"})
                copies = 2 if i % 10 == 0 else 1  # producer retries: same UID, new msgId
                for _ in range(copies):
                    if orderly:
                        producer.send_orderly(out, f"k-{i}")
                    else:
                        producer.send(out)
        settings = ConsumerSettings(
            group="g-batch",
            consume_from=ConsumeFrom.FIRST_OFFSET,
            consume_batch_size=8,
            consume_thread_count=4,
            suspend_current_queue_time=0.2,
        )
        client = ClientSettings(namesrv_addr=broker.namesrv_addr, rebalance_interval=1.0)
        runner_cls = OrderlyRunner if orderly else ConcurrentRunner
        runner = runner_cls(handle, settings=settings, client=client)
        runner.subscribe("BatchOrders")
        runner.start()
        try:
            wait_for(lambda: stats(name)["processed"] == keys * steps, 60, "every message applied")
        finally:
            runner.shutdown()
    finally:
        producer.shutdown()
        broker.stop()
        strategy.close()
    with engine.connect() as conn:
        rows = conn.execute(sa.select(effects.c.k, effects.c.step).order_by(effects.c.seq)).all()
    engine.dispose()
    assert collections.Counter(rows) == collections.Counter(
        (f"k-{i}", s) for i in range(keys) for s in range(steps)
    )  # nothing lost, nothing doubled
    assert failed_once == ["k-7"] and stats(name)["failures"] == 1
    assert max(batch_sizes) > 1  # the runner handed over batches
    if orderly:
        for i in range(keys):
            assert [s for k, s in rows if k == f"k-{i}"] == list(range(steps))
