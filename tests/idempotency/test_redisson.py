"""RedissonLock against a real Redis: reentrancy, try-lock with a wait time, waiters woken
by the unlock notification, the watchdog, a dead owner's lease, and fencing tokens.

Leases are configured short (1.5 s, renewed every 0.5 s) so the lease-dependent tests run
in seconds; the defaults (30 s / 10 s) are the same code with other numbers.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from idemp import Context, Message, Outcome, ack_of, idempotent
from idemp.strategies import LeaseLost, LockHandle, RedissonLock

ROOT = Path(__file__).resolve().parents[2]
NS = "g/Orders"


@pytest.fixture
def make_lock(redis_server: Any) -> Iterator[Callable[..., RedissonLock]]:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    made: list[RedissonLock] = []

    def factory(**options: Any) -> RedissonLock:
        strategy = RedissonLock(redis_server.url, prefix=prefix, **options)
        made.append(strategy)
        return strategy

    yield factory
    for s in made:
        s.close()


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in another thread (another lock owner) and return its result."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(30)
    assert not t.is_alive()
    return out[0]


def msg(key: str) -> Message:
    return Message("Orders", b"{}", keys=(key,), msg_id=uuid.uuid4().hex)


def test_reentrant_per_thread_and_counted(make_lock: Any) -> None:
    s = make_lock()
    lock = s.lock("a")
    assert lock.acquire(timeout=0)
    first = lock.token
    assert lock.acquire(timeout=0)  # the same thread enters again: same hold, same token
    assert lock.token == first
    raw = s.client.hgetall(s._keys("a")[0])
    assert [int(v) for k, v in raw.items() if not k.startswith(b"#")] == [2]
    assert in_thread(lambda: s.lock("a").acquire(blocking=False)) is False

    lock.release()
    assert in_thread(lambda: s.lock("a").acquire(blocking=False)) is False  # still held once
    lock.release()
    other = s.lock("a")
    assert in_thread(lambda: other.acquire(blocking=False)) is True
    assert other.token == first + 1  # a fresh hold gets a new, higher fencing token
    with pytest.raises(LeaseLost):
        lock.release()  # not ours any more


def test_try_lock_gives_up_after_its_wait_time(make_lock: Any) -> None:
    s = make_lock()
    assert s.lock("b").acquire(timeout=0)
    start = time.monotonic()
    got = in_thread(lambda: s.lock("b").acquire(timeout=0.3))
    assert got is False
    assert time.monotonic() - start >= 0.3  # it did wait (a lower bound, not a timing)


def test_waiter_is_woken_by_unlock_not_by_the_lease(make_lock: Any) -> None:
    """The holder's lease is 30 s and the waiter waits up to 20 s: the waiter can only
    get the lock in time if the unlock notification wakes it."""
    s = make_lock(lease_s=30.0, renew_s=10.0)
    holder = s.lock("c")
    assert holder.acquire(timeout=0)
    channel = s._keys("c")[2]
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(s.lock("c").acquire(timeout=20)))
    attempts_before = s.attempts
    waiter.start()
    end = time.monotonic() + 10
    while channel not in s._waiters._events and time.monotonic() < end:
        time.sleep(0.01)  # polling the test's own view: the waiter has registered
    assert channel in s._waiters._events
    notified_before = s._waiters.notifications
    holder.release()
    waiter.join(25)

    assert result == [True]
    assert s._waiters.notifications == notified_before + 1
    # try, register + try again, one retry after the wake-up (plus at most one if the
    # subscription reconnected meanwhile, which wakes every waiter): no polling loop
    assert s.attempts - attempts_before in (3, 4)
    assert s.client.pttl(s._keys("c")[0]) > 20_000  # the new hold has its own fresh lease


def test_watchdog_keeps_a_long_handlers_lock(make_lock: Any) -> None:
    """Lease 1.5 s renewed every 0.5 s; the handler runs 4 s (over 2.5 leases) while
    another owner keeps trying: it never gets in, and the handler's commit succeeds."""
    s = make_lock(lease_s=1.5, renew_s=0.5, wait_s=0)
    other = make_lock(lease_s=1.5, renew_s=0.5, wait_s=0)
    tries: list[Outcome] = []

    @idempotent(key="keys", strategy=s, namespace=NS)
    def long_handler(message: Message, ctx: Context) -> None:
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            tries.append(in_thread(lambda: contender(msg("long")).outcome))
            time.sleep(0.25)  # pacing the contender's attempts; the run length is the test
        ctx.handle.check()

    @idempotent(key="keys", strategy=other, namespace=NS)
    def contender(message: Message) -> None:
        raise AssertionError("ran while the lock was held")

    result = long_handler(msg("long"))

    assert result.outcome is Outcome.PROCESSED
    assert len(tries) >= 8 and set(tries) == {Outcome.IN_PROGRESS}
    assert s._watchdog is not None and s._watchdog.renewals >= 2  # 4 s over 1.5 s leases
    assert s.client.exists(s._keys(f"{NS}:long")[0]) == 0  # released at commit


def test_without_watchdog_the_lease_ends_and_a_stale_commit_is_refused(make_lock: Any) -> None:
    """A holder paused past its lease (no watchdog here): the next owner gets a higher
    fencing token, and the paused holder's commit is refused (the message comes back)."""
    s = make_lock(lease_s=1.0, renew_s=None, wait_s=0)
    successor = make_lock(lease_s=5.0, renew_s=None, wait_s=5.0)
    tokens: dict[str, int] = {}
    store: dict[str, Any] = {
        "fence": 0,
        "value": "",
    }  # a business store that keeps the highest token

    def fenced_write(token: int, value: str) -> bool:
        if token <= store["fence"]:
            return False
        store.update(fence=token, value=value)
        return True

    @idempotent(key="keys", strategy=successor, namespace=NS)
    def fresh(message: Message, ctx: Context) -> None:
        tokens["fresh"] = ctx.handle.token
        assert fenced_write(ctx.handle.token, "fresh")

    @idempotent(key="keys", strategy=s, namespace=NS)
    def paused(message: Message, ctx: Context) -> None:
        handle: LockHandle = ctx.handle
        tokens["paused"] = handle.token
        # The "pause": the lease runs out and someone else takes the lock meanwhile.
        assert in_thread(lambda: fresh(msg("f"))).outcome is Outcome.PROCESSED
        with pytest.raises(LeaseLost):
            handle.check()
        assert fenced_write(handle.token, "paused") is False

    result = paused(msg("f"))

    assert (result.outcome, ack_of(result)) == (Outcome.FAILED, False)
    assert isinstance(result.error, LeaseLost)
    assert tokens["fresh"] > tokens["paused"]
    assert store == {"fence": tokens["fresh"], "value": "fresh"}


HOLDER = textwrap.dedent(
    """
    import sys, threading
    from idemp.strategies import RedissonLock
    s = RedissonLock(sys.argv[1], prefix=sys.argv[2], lease_s=1.5, renew_s=0.5)
    lock = s.lock("dying")
    assert lock.acquire(timeout=0)
    print(lock.token, flush=True)
    threading.Event().wait()
    """
)


def test_owner_killed_its_lease_ends_and_the_next_owner_gets_it(make_lock: Any) -> None:
    s = make_lock(lease_s=1.5, renew_s=0.5)
    url = s.client.connection_pool.connection_kwargs
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, f"redis://{url['host']}:{url['port']}/0", s.prefix],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        dead_token = int(child.stdout.readline())
        time.sleep(2.0)  # longer than one lease: the child's watchdog is what keeps it
        assert s.lock("dying").acquire(timeout=0) is False
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    lock = s.lock("dying")
    assert lock.acquire(timeout=10)  # within one lease of the kill (1.5 s), bounded by 10
    assert lock.token == dead_token + 1
    lock.release()


def test_busy_key_is_reconsumed_later_and_keys_are_independent(make_lock: Any) -> None:
    s = make_lock(wait_s=0.2)
    ran: list[str] = []

    @idempotent(key="keys", strategy=s, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        ran.append(message.keys[0])

    assert s.lock(f"{NS}:k1").acquire(timeout=0)
    busy = in_thread(lambda: handle(msg("k1")))
    free = in_thread(lambda: handle(msg("k2")))

    assert (busy.outcome, ack_of(busy)) == (Outcome.IN_PROGRESS, False)
    assert free.outcome is Outcome.PROCESSED
    assert ran == ["k2"]


def test_built_from_url_or_client(redis_server: Any) -> None:
    client = redis.Redis.from_url(redis_server.url)
    for s in (RedissonLock(redis_server.url), RedissonLock(client)):
        lock = s.lock(f"x-{uuid.uuid4().hex}")
        assert lock.acquire(timeout=0)
        lock.release()
        s.close()
    assert client.ping()  # a client it was given is not closed
    client.close()


def _lock_keys(s: RedissonLock) -> list[bytes]:
    return sorted(s.client.scan_iter(match=f"{s.prefix}:*:lock"))


def _take_and_give_back(s: RedissonLock, name: str) -> bool:
    lock = s.lock(name)
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


def test_a_batch_locks_ahead_and_unlocks_each_message_at_its_commit(make_lock: Any) -> None:
    """consume_batch: the batch's keys locked in one round trip before the first
    handler (another owner finds a later key of the batch taken), each message unlocked
    at its own commit or abort (a second copy of a key locks afresh: a higher token),
    nothing left locked after the batch."""
    s = make_lock(wait_s=0)
    seen: list[tuple[str, int]] = []
    during: dict[str, Any] = {}

    @idempotent(key="keys", strategy=s, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        handle_: LockHandle = ctx.handle
        seen.append((ctx.key, handle_.token))
        if ctx.key == "b-1" and "d" not in during:  # another owner, while the batch runs
            during["d"] = in_thread(lambda: s.lock(f"{NS}:b-4").acquire(blocking=False))
            during["other"] = in_thread(lambda: _take_and_give_back(s, f"{NS}:b-9"))
        if ctx.key == "b-3":
            raise ValueError("b-3 fails")

    keys = ["b-1", "b-2", "b-1", "b-3", "b-4"]
    results = handle.consume_batch([msg(k) for k in keys])

    assert [r.outcome for r in results] == [
        Outcome.PROCESSED,
        Outcome.PROCESSED,
        Outcome.PROCESSED,
        Outcome.FAILED,
        Outcome.PROCESSED,
    ]
    assert during == {"d": False, "other": True}  # b-4 held ahead; b-9 not in the batch
    tokens = dict(seen[:2])
    assert [k for k, _ in seen] == keys
    assert seen[2][1] == tokens["b-1"] + 1  # the second b-1 locked again after the first's unlock
    assert _lock_keys(s) == []


def test_a_batch_releases_its_committed_locks_at_its_end_and_a_lost_lease_fails_its_message(
    make_lock: Any,
) -> None:
    """The committed messages' locks are released together when the batch finishes
    (one round trip), each only if its token is still current: l-1's lock is still held
    while l-3 runs; l-2's lease, ended (its lock deleted, as an expiry would) after its
    handler returned but before that release, fails l-2 as a refused commit does alone
    (not acked: it comes back), and the others are processed."""
    s = make_lock(wait_s=0)
    during: dict[str, Any] = {}

    @idempotent(key="keys", strategy=s, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        if ctx.key == "l-3":
            during["l-1 free"] = in_thread(lambda: _take_and_give_back(s, f"{NS}:l-1"))
            s.client.delete(s._keys(f"{NS}:l-2")[0])

    results = handle.consume_batch([msg("l-1"), msg("l-2"), msg("l-3")])

    assert [r.outcome for r in results] == [Outcome.PROCESSED, Outcome.FAILED, Outcome.PROCESSED]
    assert [ack_of(r) for r in results] == [True, False, True]
    assert isinstance(results[1].error, LeaseLost)
    assert during == {"l-1 free": False}
    assert _lock_keys(s) == []
    assert s._local == {} and s._watchdog is not None and s._watchdog._held == {}


def test_a_batch_waits_at_its_turn_for_a_key_another_holds(make_lock: Any) -> None:
    """A key held elsewhere when the batch starts is not taken ahead: its message tries
    at its turn (here: wait_s 0, so in progress), the others run; a stopping runner's
    unstarted messages give their locks back."""
    s = make_lock(wait_s=0)
    held = s.lock(f"{NS}:w-2")
    assert in_thread(lambda: held.acquire(blocking=False)) is True
    ran: list[str] = []

    @idempotent(key="keys", strategy=s, namespace=NS)
    def handle(message: Message, ctx: Context) -> None:
        ran.append(ctx.key)

    results = handle.consume_batch([msg("w-1"), msg("w-2"), msg("w-3")])
    assert [r.outcome for r in results] == [
        Outcome.PROCESSED,
        Outcome.IN_PROGRESS,
        Outcome.PROCESSED,
    ]
    assert not ack_of(results[1]) and ran == ["w-1", "w-3"]
    in_thread(held.release)

    stopped = handle.consume_batch(
        [msg("w-4"), msg("w-5"), msg("w-6")], stopping=lambda: len(ran) >= 3
    )
    assert [r.outcome for r in stopped] == [Outcome.PROCESSED]
    assert _lock_keys(s) == []  # w-5 and w-6 were locked ahead and given back


def test_an_unlock_racing_a_renewal_is_not_reported_as_a_lost_lease(
    make_lock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The watchdog renews what it held a moment ago; a lock unlocked in between fails
    that renewal, and that is the unlock, not a lost lease: no warning, nothing marked
    lost. Renewals every 2 ms against 400 lock/unlock cycles make the race frequent."""
    s = make_lock(lease_s=1.0, renew_s=0.002)
    with caplog.at_level("WARNING", logger="idemp"):
        for i in range(400):
            lock = s.lock(f"race-{i % 4}")
            assert lock.acquire(timeout=1)
            lock.release()
    assert s._watchdog is not None and s._watchdog.renewals > 0
    assert [r.getMessage() for r in caplog.records if "lease_lost" in r.getMessage()] == []


def test_a_batch_gives_back_only_its_own_level_of_a_reentered_lock(make_lock: Any) -> None:
    """The thread already holds a key of the batch (an outer hold): the batch enters it
    again ahead; when that message never starts, the batch leaves its own level only,
    and the outer hold stays held and renewed by the watchdog."""
    s = make_lock(wait_s=0)
    outer = s.lock(f"{NS}:r-2")
    assert outer.acquire(timeout=0)

    @idempotent(key="keys", strategy=s, namespace=NS)
    def handle(message: Message) -> None:
        return None

    results = handle.consume_batch([msg("r-1"), msg("r-2")], stopping=lambda: True)
    assert results == []
    lock_key = s._keys(f"{NS}:r-2")[0]
    assert s._watchdog is not None and any(k == lock_key for k, _ in s._watchdog._held)
    assert outer.held() and in_thread(lambda: s.lock(f"{NS}:r-2").acquire(blocking=False)) is False
    outer.release()
    assert _lock_keys(s) == []
