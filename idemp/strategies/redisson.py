"""Redisson-style lock: one key's handlers never run at once, across threads and processes.

Semantics (as Redisson's ``RLock``):

* **Reentrant.** The lock is a hash ``{owner: count}``; the owner is this process (a random
  id + pid) and thread, so the same thread may take it again and must release it as many
  times. ``RedissonLock.lock(name)`` gives the object; the strategy uses it per message.
* **Lease + watchdog.** The hash expires after ``lease_s`` (30 s). While a lock is held, one
  background thread per strategy renews every held lease each ``renew_s`` (10 s): a long
  handler keeps its lock; a dead process (SIGKILL, lost host) stops renewing and its lock
  ends with the lease.
* **Waiters are woken by unlock, not by polling.** The unlock script PUBLISHes on the
  lock's channel; one pattern subscription per strategy (a listener thread) wakes the
  local waiters of that channel, which then retry. A waiter registers before it tries, so
  a release between its try and its wait is never missed; it otherwise sleeps until the
  lease's remaining time or its own wait time ends, whichever is first.
* **Try-lock with a wait time** (``wait_s``); the strategy answers IN_PROGRESS (reconsume
  later) when it cannot get the lock in time.
* **Fencing token.** Each fresh acquisition INCRs a per-key counter; the token is handed to
  the handler (``ctx.handle.token``) and checked at commit: a holder whose lease ended
  (paused past it, or its watchdog lost Redis) is refused (:class:`LeaseLost`, the message
  comes back) and its token is older than the new holder's, so a store that keeps the
  highest token seen (``UPDATE … WHERE fence < :token``) refuses its late writes too.

A lock serializes handlers; it does not recognise duplicates: compose it with a state
guard (``idemp.guards``) or check the business row under the lock.

Keys: ``<prefix>:{<namespace>:<key>}:lock``, ``…:fence`` and the channel ``…:ch``; all
share the hash tag, so each script runs on the one node owning that slot on Redis
Cluster (``RedissonLock("redis+cluster://host:port")`` or a ``RedisCluster`` client).
There, the unlock's classic ``PUBLISH`` is broadcast to every node over the cluster bus,
so the one pattern subscription (on whichever node redis-py picks) hears every lock's
release. (Sharded pub/sub, ``SPUBLISH``, is Redis 7 only.)
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from idemp.outcome import Outcome
from idemp.strategies._redis import Commands, LuaScript, connect, describe
from idemp.strategies.base import BatchSession, Job, StoreError, Strategy, Ticket, Verdict
from idemp.urls import mask_url

logger = logging.getLogger("idemp")

# KEYS: lock, fence. ARGV: owner, lease ms, fence ttl ms.
# → {count, token} when acquired (count 1: fresh), else the lock's remaining ms (integer).
LOCK = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  local token = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  redis.call('HSET', KEYS[1], ARGV[1], 1)
  redis.call('HSET', KEYS[1], '#fence', token)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, token}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local n = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {n, tonumber(redis.call('HGET', KEYS[1], '#fence'))}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = 0 end
return ttl
"""

# KEYS: lock, channel. ARGV: owner, lease ms, token (or '' for any).
# → -1 not ours (lease ended, or another token), 0 released, n still held n times.
UNLOCK = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -1 end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], '#fence') ~= ARGV[3] then return -1 end
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return n
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], 'unlocked')
return 0
"""

# KEYS: lock. ARGV: owner, lease ms, token. → 1 renewed (still ours), 0 lost.
RENEW = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
   and redis.call('HGET', KEYS[1], '#fence') == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_PROCESS = uuid.uuid4().hex[:12]


class LeaseLost(RuntimeError):
    """The lock is no longer ours (its lease ended, someone else holds it): a late holder
    must not commit. Not a store error: the message comes back and runs again."""


def owner_id(thread_id: int | None = None) -> str:
    """This process and thread: ``<random>:<pid>:<thread ident>``."""
    ident = threading.get_ident() if thread_id is None else thread_id
    return f"{_PROCESS}:{os.getpid()}:{ident}"


class _Waiters:
    """One pattern subscription for all the strategy's lock channels; wakes local waiters.

    On a broken subscription (Redis restarted) every waiter is woken to retry, and the
    listener reconnects: a missed notification only costs a retry, never a lost wake-up
    beyond the lease's remaining time."""

    def __init__(self, client: Any, pattern: str) -> None:
        self._client = client
        self._pattern = pattern
        self._lock = threading.Lock()
        self._events: dict[str, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._pubsub: Any = None
        self.notifications = 0  # channels' wake-ups received (for tests and stats)

    def register(self, channel: str) -> threading.Event:
        self._ensure_listening()
        event = threading.Event()
        with self._lock:
            self._events.setdefault(channel, set()).add(event)
        return event

    def unregister(self, channel: str, event: threading.Event) -> None:
        with self._lock:
            events = self._events.get(channel)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._events[channel]

    def _wake(self, channel: str | None) -> None:
        with self._lock:
            if channel is None:
                targets = [e for events in self._events.values() for e in events]
            else:
                targets = list(self._events.get(channel, ()))
        for event in targets:
            event.set()

    def _ensure_listening(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._ready.clear()
                self._thread = threading.Thread(
                    target=self._run, name="idemp-redisson-waiters", daemon=True
                )
                self._thread.start()
        # Bounded: not subscribed in time (Redis down), waits fall back to the lease's TTL.
        self._ready.wait(5.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=False)
            self._pubsub = pubsub
            try:
                pubsub.psubscribe(self._pattern)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.25)  # bounds close()
                    if message is None:
                        continue
                    kind = message["type"]
                    if kind == "psubscribe":
                        self._wake(None)  # anything published before now was missed
                        self._ready.set()
                    elif kind == "pmessage":
                        channel = message["channel"]
                        if isinstance(channel, bytes):
                            channel = channel.decode()
                        self.notifications += 1
                        self._wake(channel)
            except (RedisError, OSError, ValueError) as exc:
                if self._stop.is_set():
                    break
                logger.warning("idemp event=lock_subscription_lost error=%r", exc)
                self._ready.clear()
                self._wake(None)
                self._stop.wait(0.5)  # reconnect backoff, bounded
            finally:
                try:
                    pubsub.close()
                except (RedisError, OSError):
                    pass

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(5.0)


@dataclass(slots=True)
class _Held:
    lock_key: str
    owner: str
    token: int
    lost: bool = False
    releasing: bool = False  # an unlock is under way: a failed renewal is that unlock


class _Watchdog:
    """Renews every held lease each ``renew_s`` seconds, pipelined, from one thread."""

    def __init__(self, strategy: RedissonLock) -> None:
        self._strategy = strategy
        self._held: dict[tuple[str, str], _Held] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0

    def add(self, held: _Held) -> None:
        with self._lock:
            self._held[(held.lock_key, held.owner)] = held
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="idemp-redisson-watchdog", daemon=True
                )
                self._thread.start()

    def remove(self, lock_key: str, owner: str) -> None:
        with self._lock:
            self._held.pop((lock_key, owner), None)

    def _run(self) -> None:
        s = self._strategy
        while not self._stop.wait(s.renew_s):
            with self._lock:
                held = list(self._held.values())
            if not held:
                continue
            try:
                replies = s._renew.many(
                    [((h.lock_key,), (h.owner, s.lease_ms, h.token)) for h in held]
                )
            except RedisError as exc:  # the next round tries again; the lease may end
                logger.warning("idemp event=lease_renewal_failed error=%r", exc)
                continue
            self.renewals += 1
            for h, ok in zip(held, replies):
                if ok != 1 and not h.releasing:
                    h.lost = True
                    self.remove(h.lock_key, h.owner)
                    logger.warning("idemp event=lease_lost lock=%s token=%s", h.lock_key, h.token)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)


class DistributedLock:
    """One named lock, ``threading.RLock``-like: ``acquire(blocking, timeout)``,
    ``release()``, ``with``; ``token`` is the fencing token of the current hold."""

    def __init__(self, strategy: RedissonLock, name: str) -> None:
        self._s = strategy
        self.name = name
        self.token: int | None = None

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        wait = 0.0 if not blocking else (float("inf") if timeout is None else timeout)
        got = self._s.acquire(self.name, owner_id(), wait)
        if got is None:
            return False
        self.token = got[1]
        return True

    def release(self) -> None:
        left = self._s.release(self.name, owner_id(), None)
        if left < 0:
            raise LeaseLost(f"lock {self.name!r} is not held by this thread")

    def held(self) -> bool:
        return self.token is not None and self._s.holds(self.name, owner_id(), self.token)

    def __enter__(self) -> DistributedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class LockHandle:
    """``ctx.handle`` of :class:`RedissonLock`: the fencing token, and a check the
    handler may run before an irreversible write."""

    name: str
    token: int
    owner: str
    _check: Callable[[], bool]

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this hold is still current."""
        if not self._check():
            raise LeaseLost(f"lock {self.name!r} (token {self.token}) is no longer held")


def lease_lost(handle: LockHandle) -> LeaseLost:
    return LeaseLost(f"lock {handle.name!r}: token {handle.token} lost its lease before commit")


class RedissonLock(Strategy):
    """``RedissonLock("redis://…")`` or ``RedissonLock(client)``; ``lease_s`` (30),
    ``renew_s`` (10; None: no watchdog, the lease alone bounds a hold), ``wait_s`` (how long
    ``begin`` waits for a busy key before IN_PROGRESS), ``prefix``."""

    name = "redisson_lock"

    def __init__(
        self,
        client: str | Any,
        *,
        lease_s: float = 30.0,
        renew_s: float | None = 10.0,
        wait_s: float = 3.0,
        prefix: str = "idemp",
        fence_ttl_s: float = 7 * 86400.0,
        socket_timeout_s: float = 5.0,
    ) -> None:
        if lease_s <= 0 or wait_s < 0:
            raise ValueError("lease_s must be positive and wait_s not negative")
        if renew_s is not None and not 0 < renew_s < lease_s:
            raise ValueError("renew_s must be positive and shorter than lease_s")
        client, self._owns_client = connect(client, socket_timeout_s)
        self.client = client
        self.prefix = prefix
        self.lease_ms = int(lease_s * 1000)
        self.renew_s = renew_s
        self.wait_s = wait_s
        self.fence_ttl_ms = int(fence_ttl_s * 1000)
        self._commands = commands = Commands(client)
        self._lock = LuaScript(commands, LOCK)
        self._unlock = LuaScript(commands, UNLOCK)
        self._renew = LuaScript(commands, RENEW)
        self._waiters = _Waiters(client, f"{prefix}:*:ch")
        self._watchdog = _Watchdog(self) if renew_s is not None else None
        self._local: dict[tuple[str, str], _Held] = {}
        self._local_lock = threading.Lock()
        self.attempts = 0  # lock scripts run (for tests: waiters retry on wake-ups only)

    def __repr__(self) -> str:
        where = mask_url(describe(self.client))
        return f"RedissonLock({where}, lease_ms={self.lease_ms}, renew_s={self.renew_s})"

    # -- keys ---------------------------------------------------------------------------
    def _keys(self, name: str) -> tuple[str, str, str]:
        base = f"{self.prefix}:{{{name}}}"
        return f"{base}:lock", f"{base}:fence", f"{base}:ch"

    def lock(self, name: str) -> DistributedLock:
        return DistributedLock(self, name)

    # -- primitives ---------------------------------------------------------------------
    def acquire(self, name: str, owner: str, wait_s: float) -> tuple[int, int] | None:
        """Take (or re-enter) ``name`` for ``owner`` within ``wait_s``: → (count, token),
        or None if it stayed busy. Raises :class:`StoreError`."""
        lock_key, fence_key, channel = self._keys(name)
        deadline = time.monotonic() + wait_s
        event: threading.Event | None = None
        try:
            while True:
                self.attempts += 1
                try:
                    reply = self._lock(
                        [lock_key, fence_key], [owner, self.lease_ms, self.fence_ttl_ms]
                    )
                except RedisError as exc:
                    raise StoreError(f"lock {name!r} failed: {exc}") from exc
                if isinstance(reply, list):
                    count, token = int(reply[0]), int(reply[1])
                    self._held(lock_key, owner, token)
                    return count, token
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                if event is None:  # register, then try once more: no release is missed
                    event = self._waiters.register(channel)
                    continue
                # Woken by the unlock notification, or when the holder's lease may end.
                event.wait(min(remaining, max(int(reply), 1) / 1000.0))
                event.clear()
        finally:
            if event is not None:
                self._waiters.unregister(channel, event)

    def _held(self, lock_key: str, owner: str, token: int) -> None:
        held = _Held(lock_key, owner, token)
        with self._local_lock:
            self._local.setdefault((lock_key, owner), held)
            held = self._local[(lock_key, owner)]
            held.token, held.lost, held.releasing = token, False, False
        if self._watchdog is not None:
            self._watchdog.add(held)

    def release(self, name: str, owner: str, token: int | None) -> int:
        """Leave one level of ``owner``'s hold (only if ``token`` is current, when given):
        → holds left (0: released, waiters notified), or -1 if it was not ours."""
        lock_key, _fence, channel = self._keys(name)
        left = -1
        with self._local_lock:
            held = self._local.get((lock_key, owner))
        if held is not None:
            held.releasing = True
        try:
            left = int(
                self._unlock(
                    [lock_key, channel],
                    [owner, self.lease_ms, "" if token is None else str(token)],
                )
            )
        except RedisError as exc:
            # Stop renewing: the lease, not this process, now decides when the hold ends.
            left = 0
            raise StoreError(f"unlock {name!r} failed: {exc}") from exc
        finally:
            if left <= 0:
                self._forget(lock_key, owner)
            elif held is not None:
                held.releasing = False  # still held (reentered): renewals count again
        return left

    def _forget(self, lock_key: str, owner: str) -> None:
        with self._local_lock:
            self._local.pop((lock_key, owner), None)
        if self._watchdog is not None:
            self._watchdog.remove(lock_key, owner)

    def holds(self, name: str, owner: str, token: int) -> bool:
        lock_key = self._keys(name)[0]
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(lock_key, owner)
            pipe.hget(lock_key, "#fence")
            count, fence = pipe.execute()
        except RedisError as exc:
            raise StoreError(f"lock check {name!r} failed: {exc}") from exc
        return count is not None and fence is not None and int(fence) == token

    # -- the Strategy interface ---------------------------------------------------------
    def try_acquire_many(self, names: Sequence[str], owner: str) -> dict[str, int]:
        """Try each lock once, without waiting, in one pipelined round trip: → the
        fencing tokens of those taken. On an error the ones this call may have taken
        are given back (best effort) and :class:`StoreError` is raised."""
        keys = [self._keys(name) for name in names]
        args = (owner, self.lease_ms, self.fence_ttl_ms)
        try:
            replies = self._lock.many([((lock, fence), args) for lock, fence, _ in keys])
        except RedisError as exc:
            try:
                self._release_many(names, owner)
            except RedisError:
                pass  # their leases end them
            raise StoreError(f"batch lock failed: {exc}") from exc
        got: dict[str, int] = {}
        for name, (lock_key, _fence, _channel), reply in zip(names, keys, replies):
            if isinstance(reply, list):
                got[name] = int(reply[1])
                self._held(lock_key, owner, got[name])
        return got

    def _release_many(self, names: Sequence[str], owner: str) -> None:
        """As :meth:`release` for each name: a hold still entered (an outer one of the
        same thread) keeps being renewed; on an error the leases decide."""
        keys = [self._keys(name) for name in names]
        left: list[Any] = [0] * len(keys)
        try:
            left = self._unlock.many(
                [((lock, ch), (owner, self.lease_ms, "")) for lock, _f, ch in keys]
            )
        finally:
            for (lock_key, _fence, _channel), n in zip(keys, left):
                if int(n) <= 0:
                    self._forget(lock_key, owner)

    def release_many(self, names: Sequence[str], owner: str) -> None:
        """Give back holds never used (one level each), in one pipelined round trip."""
        try:
            self._release_many(names, owner)
        except RedisError as exc:
            raise StoreError(f"batch unlock failed: {exc}") from exc

    def release_held(self, handles: Sequence[LockHandle]) -> list[int]:
        """:meth:`release` for each hold (only if its token is current; one hold per
        lock), in one pipelined round trip, in order: → holds left each (-1: not ours
        any more)."""
        keys = [self._keys(h.name) for h in handles]
        with self._local_lock:
            for (lock_key, _f, _c), h in zip(keys, handles):
                held = self._local.get((lock_key, h.owner))
                if held is not None:
                    held.releasing = True
        left: list[int] = [0] * len(keys)
        try:
            replies = self._unlock.many(
                [
                    ((lock, ch), (h.owner, self.lease_ms, str(h.token)))
                    for (lock, _f, ch), h in zip(keys, handles)
                ]
            )
            left = [int(n) for n in replies]
        except RedisError as exc:  # the leases, not this process, now end these holds
            raise StoreError(f"batch unlock failed: {exc}") from exc
        finally:
            for (lock_key, _f, _c), h, n in zip(keys, handles, left):
                if n <= 0:
                    self._forget(lock_key, h.owner)
                else:  # still held (an outer hold of the same thread): renewals count again
                    with self._local_lock:
                        held = self._local.get((lock_key, h.owner))
                    if held is not None:
                        held.releasing = False
        return left

    def ticket(self, job: Job, name: str, owner: str, token: int) -> Ticket:
        handle = LockHandle(name, token, owner, lambda: self.holds(name, owner, token))
        return Ticket(job, Verdict.RUN, str(token), handle=handle, private=handle)

    def begin(self, job: Job) -> Ticket:
        name = f"{job.namespace}:{job.key}"
        owner = owner_id()
        got = self.acquire(name, owner, self.wait_s)
        if got is None:
            return Ticket(job, Verdict.IN_PROGRESS, detail="lock busy past the wait time")
        return self.ticket(job, name, owner, got[1])

    def session(self, jobs: Sequence[Job]) -> BatchSession | None:
        """The batch's locks tried in one round trip before the first handler runs
        (:class:`_LockAheadSession`)."""
        return _LockAheadSession(self, jobs) if len(jobs) >= 2 else None

    def commit(self, ticket: Ticket) -> None:
        """Unlock only if our hold (this token) is still current; otherwise refuse."""
        handle: LockHandle = ticket.private
        if self.release(handle.name, handle.owner, handle.token) < 0:
            raise lease_lost(handle)

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        handle: LockHandle = ticket.private
        self.release(handle.name, handle.owner, handle.token)

    def classify(self, error: BaseException) -> Outcome | None:
        return Outcome.FAILED if isinstance(error, LeaseLost) else None

    def close(self) -> None:
        self._waiters.close()
        if self._watchdog is not None:
            self._watchdog.close()
        self._commands.close()
        if self._owns_client:
            self.client.close()


class _LockAheadSession(BatchSession):
    """A runner's batch on :class:`RedissonLock`: the batch's distinct keys locked in
    one pipelined round trip (try-lock, no wait) before the first handler runs; a key
    another holds is waited for at its message's turn, as alone. A failed handler's
    lock is released at once, as alone; the committed messages' locks are released
    together at ``finish``, in one round trip, each only if its token is still current,
    so a lease lost before that release fails its message as a refused commit does
    alone (the lock is held a little longer: to the batch's end, not the handler's). A
    later copy of a key in the batch first releases the earlier copy's hold, then locks
    afresh (a new fencing token), as alone. Locks of messages never started are given
    back at close in one round trip."""

    def __init__(self, strategy: RedissonLock, jobs: Sequence[Job]) -> None:
        self.strategy = strategy
        self.owner = owner_id()
        self.done: dict[str, Ticket] = {}  # committed, released at finish: by lock name
        self._refused: list[tuple[Ticket, BaseException]] = []
        self._error: StoreError | None = None  # a release before finish that failed
        names = list(dict.fromkeys(f"{job.namespace}:{job.key}" for job in jobs))
        try:
            self.ahead = strategy.try_acquire_many(names, self.owner)
        except StoreError:
            self.ahead = {}  # each message locks at its turn (and says what failed)

    def begin(self, job: Job) -> Ticket:
        name = f"{job.namespace}:{job.key}"
        earlier = self.done.pop(name, None)
        if earlier is not None:
            try:
                self._release([earlier])
            except StoreError as exc:  # reported at finish, as a commit's would be
                self._error = exc
        token = self.ahead.pop(name, None)
        if token is None:
            return self.strategy.begin(job)
        return self.strategy.ticket(job, name, self.owner, token)

    def commit(self, ticket: Ticket) -> None:
        self.done[ticket.private.name] = ticket

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        self.strategy.abort(ticket, error)

    def _release(self, tickets: list[Ticket]) -> None:
        left = self.strategy.release_held([t.private for t in tickets])
        for ticket, n in zip(tickets, left):
            if n < 0:
                self._refused.append((ticket, lease_lost(ticket.private)))

    def finish(self) -> None:
        done = list(self.done.values())
        self.done = {}
        if done:
            self._release(done)
        if self._error is not None:
            raise self._error

    def refused(self) -> Sequence[tuple[Ticket, BaseException]]:
        return self._refused

    def close(self) -> None:
        unstarted, self.ahead = list(self.ahead), {}
        unreleased = list(self.done.values())  # finish never ran: give them back
        self.done = {}
        try:
            if unreleased:
                self.strategy.release_held([t.private for t in unreleased])
        except StoreError:
            pass  # their leases end them
        try:
            if unstarted:
                self.strategy.release_many(unstarted, self.owner)
        except StoreError:
            pass  # their leases end them; the redeliveries wait that long
