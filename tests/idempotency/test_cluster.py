"""RedisFlag and RedissonLock unchanged on a real 3-master Redis Cluster (the
``redis_cluster`` fixture: three redis-server 6.2 processes, slots split in three).

What the cluster changes and what these tests pin down: one record's keys must share a
slot (hash tags), a batch spans nodes (pipelined per node), a node may lose its scripts
on its own (NOSCRIPT from one node only), and the unlock notification is published on
the lock's node but heard through a subscription that may sit on another node.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from idemp import Context, Message, Outcome, ack_of, idempotent
from idemp.config import build_strategy
from idemp.strategies import (
    CONSUMED,
    ClaimLost,
    Job,
    LeaseLost,
    RedisFlag,
    RedissonLock,
    Verdict,
)
from tests.idempotency.test_race_and_crash import run_race

NS = "cluster-group/Orders"


def msg(key: str) -> Message:
    return Message("Orders", b"{}", keys=(key,), msg_id=uuid.uuid4().hex)


def node_of(client: RedisCluster, key: str) -> str:
    return str(client.get_node_from_key(key).name)


@pytest.fixture
def make_flag(redis_cluster: Any) -> Iterator[Callable[..., RedisFlag]]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    made: list[RedisFlag] = []

    def factory(**options: Any) -> RedisFlag:
        flag = RedisFlag(redis_cluster.url, prefix=prefix, **options)
        made.append(flag)
        return flag

    yield factory
    for f in made:
        f.close()


@pytest.fixture
def make_lock(redis_cluster: Any) -> Iterator[Callable[..., RedissonLock]]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    made: list[RedissonLock] = []

    def factory(**options: Any) -> RedissonLock:
        lock = RedissonLock(redis_cluster.url, prefix=prefix, **options)
        made.append(lock)
        return lock

    yield factory
    for s in made:
        s.close()


def in_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return out[0]


# -- the cluster itself and the URL form -------------------------------------------------


def test_the_fixture_is_a_three_master_cluster_and_urls_build_cluster_clients(
    redis_cluster: Any,
) -> None:
    flag = RedisFlag(redis_cluster.url)
    assert isinstance(flag.client, RedisCluster)
    assert len(flag.client.get_primaries()) == 3
    assert repr(flag).startswith("RedisFlag(redis+cluster://127.0.0.1:")
    flag.close()
    # Several seeds, and the configuration picks the Redis flag for the scheme.
    seeds = ",".join(f"{n.host}:{n.port}" for n in redis_cluster.nodes)
    built = build_strategy(f"redis+cluster://{seeds}")
    assert isinstance(built, RedisFlag) and isinstance(built.client, RedisCluster)
    built.close()
    lock = build_strategy(redis_cluster.url, strategy="redisson_lock")
    assert isinstance(lock, RedissonLock) and isinstance(lock.client, RedisCluster)
    lock.close()
    with pytest.raises(ValueError, match="database 0"):
        RedisFlag(f"{redis_cluster.url}/3")


# -- RedisFlag ---------------------------------------------------------------------------


def test_flag_claim_commit_duplicate_and_record_in_one_slot(make_flag: Any) -> None:
    flag = make_flag()
    effects: list[str] = []

    @idempotent(key="keys", strategy=flag, namespace=NS)
    def handle(message: Message) -> None:
        effects.append(message.keys[0])

    first, second = handle(msg("o-1")), handle(msg("o-1"))
    assert (first.outcome, second.outcome) == (Outcome.PROCESSED, Outcome.DUPLICATE)
    assert effects == ["o-1"]
    record = flag.get(NS, "o-1")
    assert record is not None and (record.status, record.attempts) == (CONSUMED, 1)
    key = flag.record_key(NS, "o-1")
    assert key.endswith("{" + NS + ":o-1}")  # the hash tag is the namespaced key
    assert flag.client.keyslot(key) == flag.client.keyslot(NS + ":o-1")


def test_flag_takeover_past_deadline_and_the_stale_commit_is_refused(make_flag: Any) -> None:
    deadline = 0.5
    flag = make_flag(deadline_s=deadline)
    stale = flag.begin(Job(NS, "o-2", msg("o-2")))
    assert stale.verdict is Verdict.RUN
    assert flag.begin(Job(NS, "o-2", msg("o-2"))).verdict is Verdict.IN_PROGRESS
    time.sleep(deadline + 0.3)  # the deadline is the server's clock (0.3 s margin)
    taker = flag.begin(Job(NS, "o-2", msg("o-2")))
    assert (taker.verdict, taker.attempts) == (Verdict.TAKEOVER, 2)
    with pytest.raises(ClaimLost):
        flag.commit(stale)
    flag.commit(taker)
    record = flag.get(NS, "o-2")
    assert record is not None and (record.status, record.owner) == (CONSUMED, taker.token)


def test_flag_handler_failure_releases_and_redelivery_runs_once(make_flag: Any) -> None:
    flag = make_flag()
    failures = [RuntimeError("downstream timeout")]
    runs: list[str] = []

    @idempotent(key="keys", strategy=flag, namespace=NS)
    def flaky(message: Message) -> None:
        runs.append(message.keys[0])
        if failures:
            raise failures.pop()

    failed = flaky(msg("o-3"))
    assert (failed.outcome, ack_of(failed)) == (Outcome.FAILED, False)
    assert flag.get(NS, "o-3") is None  # released by its owner
    assert flaky(msg("o-3")).outcome is Outcome.PROCESSED
    assert flaky(msg("o-3")).outcome is Outcome.DUPLICATE
    assert runs == ["o-3", "o-3"]


def test_flag_batch_spans_every_node_pipelined_per_node(make_flag: Any) -> None:
    flag = make_flag()
    seen: list[list[str]] = []

    @idempotent.batch(key="keys", strategy=flag, namespace=NS)
    def handle(messages: list[Message]) -> None:
        seen.append([m.keys[0] for m in messages])

    keys = [f"b-{i:02d}" for i in range(29)]
    # And three records that share the first one's slot: one script call takes them all.
    slot = flag.client.keyslot(flag.record_key(NS, keys[0]))
    keys += [
        k
        for k in (f"same-{i}" for i in range(200_000))
        if flag.client.keyslot(flag.record_key(NS, k)) == slot
    ][:3]
    assert len(keys) == 32
    nodes = {node_of(flag.client, flag.record_key(NS, k)) for k in keys}
    assert len(nodes) >= 2  # 29 random slots over 3 masters: in practice all three

    first = handle([msg(k) for k in keys])
    again = handle([msg(k) for k in keys])

    assert first.count(Outcome.PROCESSED) == 32 and ack_of(first)
    assert again.count(Outcome.DUPLICATE) == 32
    assert seen == [keys]
    for k in keys:
        record = flag.get(NS, k)
        assert record is not None and record.status == CONSUMED
    # Each record lives on the node that owns its slot (the scripts never crossed slots).
    for k in keys:
        name = flag.record_key(NS, k)
        node = flag.client.get_node_from_key(name)
        assert flag.client.get_redis_connection(node).exists(name) == 1


def test_flag_one_node_lost_its_scripts_only_that_nodes_calls_rerun(
    make_flag: Any, redis_cluster: Any
) -> None:
    """SCRIPT FLUSH on one master (as after its restart): a batch across all nodes gets
    NOSCRIPT from that node only; those calls are re-run after a load, the others are not
    (a re-run would have answered "in progress" for our own fresh claims)."""
    flag = make_flag()
    keys = [f"n-{i:02d}" for i in range(32)]
    flag.begin_many([Job(NS, "warm", msg("warm"))])  # scripts now loaded on every master
    victim = redis_cluster.nodes[1]
    direct = redis.Redis(host=victim.host, port=victim.port)
    direct.script_flush()
    direct.close()
    on_victim = [
        k for k in keys if node_of(flag.client, flag.record_key(NS, k)).endswith(f":{victim.port}")
    ]
    assert 0 < len(on_victim) < len(keys)

    tickets = flag.begin_many([Job(NS, k, msg(k)) for k in keys])

    assert [t.verdict for t in tickets] == [Verdict.RUN] * len(keys)
    flag.commit_many(tickets)
    assert all(flag.get(NS, k).status == CONSUMED for k in keys)


def test_a_claim_rerun_by_its_owner_is_still_its_own(make_flag: Any) -> None:
    """A claim whose reply was lost and is sent again (redis-py's cluster pipeline re-sends
    on connection errors) finds its own token: still RUN, not "in progress"."""
    flag = make_flag()
    job = Job(NS, "r-1", msg("r-1"))
    args = ["tok-1", "", flag._consuming_ttl, flag._retention]
    key = flag.record_key(NS, "r-1")
    assert flag._claim([key], args) == 1
    assert flag._claim([key], args) == 1
    assert flag._claim([key], ["tok-2", *args[1:]]) != 1  # anyone else: the stored value
    assert flag.begin(job).verdict is Verdict.IN_PROGRESS


@pytest.mark.slow
def test_flag_race_on_cluster_every_effect_exactly_once(
    redis_cluster: Any, postgres_server: Any
) -> None:
    """4 processes × 8 threads deliver the same 1,000 keys at once through the cluster;
    the business table (PostgreSQL, no unique key) has each effect exactly once."""
    spec = {"kind": "redis", "url": redis_cluster.url, "name": f"t_{uuid.uuid4().hex[:12]}"}
    counts, totals = run_race(spec, postgres_server.url, processes=4, threads=8, keys=1000)

    assert len(counts) == 1000 and set(counts.values()) == {1}
    acked = 4 * 8 * 1000
    assert {k: v for k, v in totals.items() if k != "IN_PROGRESS"} == {
        "PROCESSED": 1000,
        "DUPLICATE": acked - 1000,
    }


# -- RedissonLock ------------------------------------------------------------------------


def test_lock_reentrant_and_counted(make_lock: Any) -> None:
    s = make_lock()
    lock = s.lock("a")
    assert lock.acquire(timeout=0) and lock.acquire(timeout=0)
    first = lock.token
    lock_key, fence_key, channel = s._keys("a")
    assert s.client.keyslot(lock_key) == s.client.keyslot(fence_key) == s.client.keyslot(channel)
    raw = s.client.hgetall(lock_key)
    assert [int(v) for k, v in raw.items() if not k.startswith(b"#")] == [2]
    assert in_thread(lambda: s.lock("a").acquire(blocking=False)) is False
    lock.release()
    assert in_thread(lambda: s.lock("a").acquire(blocking=False)) is False
    lock.release()
    other = s.lock("a")
    assert in_thread(lambda: other.acquire(blocking=False)) is True
    assert other.token == first + 1


def test_lock_waiter_woken_by_unlock_published_on_another_node(make_lock: Any) -> None:
    """The subscription sits on one node; the lock is chosen on another, so the wake-up
    can only come from the cluster bus broadcasting the unlock's PUBLISH."""
    s = make_lock(lease_s=30.0, renew_s=10.0)
    s._waiters._ensure_listening()  # subscribe now, to learn on which node
    pubsub_node = s._waiters._pubsub.get_pubsub_node().name
    name = next(
        f"c{i}" for i in range(1000) if node_of(s.client, s._keys(f"c{i}")[0]) != pubsub_node
    )
    holder = s.lock(name)
    assert holder.acquire(timeout=0)
    channel = s._keys(name)[2]
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(s.lock(name).acquire(timeout=20)))
    attempts_before = s.attempts
    waiter.start()
    end = time.monotonic() + 10
    while channel not in s._waiters._events and time.monotonic() < end:
        time.sleep(0.01)  # polling the test's own view: the waiter has registered
    assert channel in s._waiters._events
    notified_before = s._waiters.notifications
    holder.release()
    waiter.join(25)

    assert result == [True]  # within 20 s of a 30 s lease: only the notification explains it
    assert s._waiters.notifications == notified_before + 1
    assert s.attempts - attempts_before in (3, 4)  # no polling loop (see test_redisson)


def test_lock_watchdog_renews_on_the_owning_node(make_lock: Any) -> None:
    s = make_lock(lease_s=1.5, renew_s=0.5)
    locks = [s.lock(f"w{i}") for i in range(6)]  # several nodes, renewed in one batch
    for lock in locks:
        assert lock.acquire(timeout=0)
    assert len({node_of(s.client, s._keys(f"w{i}")[0]) for i in range(6)}) >= 2
    time.sleep(3.5)  # over two leases: only renewals keep them (the test's subject)
    assert s._watchdog is not None and s._watchdog.renewals >= 2
    assert all(lock.held() for lock in locks)
    assert in_thread(lambda: s.lock("w0").acquire(blocking=False)) is False
    for lock in locks:
        lock.release()


def test_lock_fencing_token_refuses_a_stale_commit(make_lock: Any) -> None:
    s = make_lock(lease_s=1.0, renew_s=None, wait_s=0)
    successor = make_lock(lease_s=5.0, renew_s=None, wait_s=5.0)
    tokens: dict[str, int] = {}

    @idempotent(key="keys", strategy=successor, namespace=NS)
    def fresh(message: Message, ctx: Context) -> None:
        tokens["fresh"] = ctx.handle.token

    @idempotent(key="keys", strategy=s, namespace=NS)
    def paused(message: Message, ctx: Context) -> None:
        tokens["paused"] = ctx.handle.token
        assert in_thread(lambda: fresh(msg("f"))).outcome is Outcome.PROCESSED
        with pytest.raises(LeaseLost):
            ctx.handle.check()

    result = paused(msg("f"))
    assert (result.outcome, ack_of(result)) == (Outcome.FAILED, False)
    assert isinstance(result.error, LeaseLost)
    assert tokens["fresh"] > tokens["paused"]


def test_a_runners_batch_spans_the_nodes(make_flag: Callable[..., RedisFlag]) -> None:
    """consume_batch on the cluster: the batch's claims and commits go to every node in
    one script call per node; a failure, a repeated key and a consumed key as alone."""
    flag = make_flag()
    applied: list[str] = []

    @idempotent(key="keys", strategy=flag, namespace=NS)
    def handle(message: Message) -> None:
        if message.keys[0] == "k-5":
            raise ValueError("k-5 fails")
        applied.append(message.keys[0])

    assert handle(msg("k-0")).outcome is Outcome.PROCESSED
    keys = [f"k-{i}" for i in range(12)] + ["k-3"]
    names = {node_of(flag.client, flag.record_key(NS, k)) for k in keys}
    assert len(names) == 3  # the batch's records live on all three masters
    results = handle.consume_batch([msg(k) for k in keys])

    expected = [Outcome.DUPLICATE] + [Outcome.PROCESSED] * 11 + [Outcome.DUPLICATE]
    expected[5] = Outcome.FAILED
    assert [r.outcome for r in results] == expected
    assert applied == [f"k-{i}" for i in range(12) if i != 5]  # k-0 before the batch
    assert flag.get(NS, "k-5") is None
    for k in ("k-1", "k-11", "k-3"):
        record = flag.get(NS, k)
        assert record is not None and record.status == CONSUMED
