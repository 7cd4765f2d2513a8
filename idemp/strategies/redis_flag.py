"""Redis flag with TTL: CONSUMING with a processing deadline, then CONSUMED for the
retention period. One Lua round trip per claim, whatever the answer (new, duplicate,
in progress, taken over), and one per commit or release. A batch is one script call for
all its keys (``LuaScript.per_key``); on Redis Cluster one per hash slot, pipelined per
node (see ``_redis``).

Record: one string key ``<prefix>:{<namespace>:<key>}`` (a hash tag, so a key's records
stay in one Redis Cluster slot) holding ``<C|D>|<owner token>|<fingerprint>|<attempts>``.
A CONSUMING record lives ``deadline + retention`` ms: while its TTL is above the retention
its holder is within the deadline; below, anyone may take it over, atomically in the
claim script. Time is the Redis server's (``PTTL``): consumers' clocks never matter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from idemp.strategies._redis import Commands, LuaScript, connect, describe
from idemp.strategies.base import (
    CONSUMED,
    CONSUMING,
    BatchSession,
    ClaimAheadSession,
    ClaimLost,
    ClaimStrategy,
    Job,
    Record,
    StoreError,
    Ticket,
    Verdict,
    new_token,
    verdict_of_existing,
)
from idemp.urls import mask_url

# Each script's per-key logic is one Lua function taking the key's current value (false
# when absent); the single-key scripts call it once, the batch scripts once per key after
# one MGET of all their keys (all keys in one EVALSHA: one command to pack, send, run and
# parse instead of one per key, and two calls into Redis per key instead of three or two
# per key; on a cluster, one EVALSHA per slot).

# claim(key, value, token, fingerprint, CONSUMING ttl ms, retention ms)
# → 1 (claimed a new key, or already ours: a re-run of this very claim after a lost
# reply), {old value} (took over past the deadline), or the stored value.
_CLAIM_FN = """
local function claim(key, v, token, fp, ttl, retention)
  if not v then
    redis.call('SET', key, 'C|' .. token .. '|' .. fp .. '|1', 'PX', ttl)
    return 1
  end
  if string.byte(v, 1) == 67 then
    local mine = 'C|' .. token .. '|'
    if string.sub(v, 1, #mine) == mine then return 1 end
    if redis.call('PTTL', key) <= retention then
      local n = tonumber(string.match(v, '|(%d+)$')) or 1
      redis.call('SET', key, 'C|' .. token .. '|' .. fp .. '|' .. (n + 1), 'PX', ttl)
      return {v}
    end
  end
  return v
end
"""

# commit(key, value, token, fingerprint, retention ms). Owner only: CONSUMING → CONSUMED.
# A record lost with the server (restart without persistence) is written again, since
# the effect happened. → 1 committed (or already), 0 the claim belongs to someone else.
_COMMIT_FN = """
local function commit(key, v, token, fp, retention)
  local mine = 'C|' .. token .. '|'
  if v and string.sub(v, 1, #mine) == mine then
    redis.call('SET', key, 'D' .. string.sub(v, 2), 'PX', retention)
    return 1
  end
  if not v then
    redis.call('SET', key, 'D|' .. token .. '|' .. fp .. '|1', 'PX', retention)
    return 1
  end
  if string.sub(v, 1, #mine) == 'D' .. string.sub(mine, 2) then
    return 1
  end
  return 0
end
"""

# release(key, value, token). Owner only: delete a CONSUMING record. → 1 released, 0 not
# ours.
_RELEASE_FN = """
local function release(key, v, token)
  local mine = 'C|' .. token .. '|'
  if v and string.sub(v, 1, #mine) == mine then
    return redis.call('DEL', key)
  end
  return 0
end
"""

# Single key: KEYS[1]; ARGV: token, fingerprint, CONSUMING ttl ms, retention ms. A new key
# is one SET NX; only an existing one is read.
CLAIM = (
    _CLAIM_FN
    + """
local record = 'C|' .. ARGV[1] .. '|' .. ARGV[2] .. '|1'
if redis.call('SET', KEYS[1], record, 'NX', 'PX', ARGV[3]) then return 1 end
return claim(KEYS[1], redis.call('GET', KEYS[1]), ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]))
"""
)
# KEYS[1]; ARGV: token, retention ms, fingerprint.
COMMIT = (
    _COMMIT_FN + "return commit(KEYS[1], redis.call('GET', KEYS[1]), ARGV[1], ARGV[3], ARGV[2])"
)
# KEYS[1]; ARGV: token.
RELEASE = _RELEASE_FN + "return release(KEYS[1], redis.call('GET', KEYS[1]), ARGV[1])"

# Batches: KEYS[1..n], one owner token for the whole batch (the batch is one owner), and
# a fingerprint per key only when some job has one: a handful of arguments instead of two
# per key to pack, send and turn into Lua strings. One reply per key. A key given twice
# in one call is claimed once; its repeat gets the stored value (in progress).
# ARGV: CONSUMING ttl ms, retention ms, token, [fingerprint per key].
CLAIM_MANY = (
    _CLAIM_FN
    + """
local values, out, seen = redis.call('MGET', unpack(KEYS)), {}, {}
local ttl, retention, token = ARGV[1], tonumber(ARGV[2]), ARGV[3]
for i = 1, #KEYS do
  local key = KEYS[i]
  if seen[key] then
    out[i] = redis.call('GET', key)
  else
    seen[key] = true
    out[i] = claim(key, values[i], token, ARGV[3 + i] or '', ttl, retention)
  end
end
return out
"""
)
# ARGV: retention ms, token, [fingerprint per key].
COMMIT_MANY = (
    _COMMIT_FN
    + """
local values, out = redis.call('MGET', unpack(KEYS)), {}
for i = 1, #KEYS do
  out[i] = commit(KEYS[i], values[i], ARGV[2], ARGV[2 + i] or '', ARGV[1])
end
return out
"""
)
# ARGV: token.
RELEASE_MANY = (
    _RELEASE_FN
    + """
local values, out = redis.call('MGET', unpack(KEYS)), {}
for i = 1, #KEYS do
  out[i] = release(KEYS[i], values[i], ARGV[1])
end
return out
"""
)


def _fingerprints(jobs: Sequence[Job]) -> list[tuple[str, ...]]:
    """Each key's per-key arguments: its fingerprint when any job has one, else none."""
    if any(job.fingerprint for job in jobs):
        return [(job.fingerprint or "",) for job in jobs]
    return [()] * len(jobs)


def _by_token(tickets: Sequence[Ticket]) -> dict[str, list[int]]:
    """Indices of ``tickets`` per owner token (one group for the tickets of one batch)."""
    groups: dict[str, list[int]] = {}
    for i, ticket in enumerate(tickets):
        groups.setdefault(ticket.token, []).append(i)
    return groups


def _parse(value: bytes | str) -> tuple[str, str, str | None, int]:
    """(status, owner, fingerprint, attempts) of a stored value (``str`` when the client
    was made with ``decode_responses=True``)."""
    text = value.decode() if isinstance(value, bytes) else value
    flag, owner, fp, attempts = text.split("|")
    return (CONSUMING if flag == "C" else CONSUMED), owner, fp or None, int(attempts)


class RedisFlag(ClaimStrategy):
    """``RedisFlag("redis://host:6379/0")``, ``RedisFlag("redis+cluster://host:7000")`` or
    ``RedisFlag(client)`` (a ``redis.Redis`` or ``redis.cluster.RedisCluster``);
    ``deadline_s``, ``retention_s``, ``prefix``."""

    name = "redis_flag"

    def __init__(
        self,
        client: str | Any,
        *,
        deadline_s: float = 60.0,
        retention_s: float = 7 * 86400.0,
        prefix: str = "idemp",
        socket_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(deadline_s=deadline_s, retention_s=retention_s)
        self.client, self._owns_client = connect(client, socket_timeout_s)
        self.prefix = prefix
        self._commands = commands = Commands(self.client)
        self._claim = LuaScript(commands, CLAIM)
        self._commit = LuaScript(commands, COMMIT)
        self._release = LuaScript(commands, RELEASE)
        self._claim_many = LuaScript(commands, CLAIM_MANY)
        self._commit_many = LuaScript(commands, COMMIT_MANY)
        self._release_many = LuaScript(commands, RELEASE_MANY)
        self._consuming_ttl = str(self.deadline_ms + self.retention_ms)
        self._retention = str(self.retention_ms)

    def __repr__(self) -> str:
        return f"RedisFlag({mask_url(describe(self.client))}, deadline_ms={self.deadline_ms})"

    def record_key(self, namespace: str, key: str) -> str:
        return f"{self.prefix}:{{{namespace}:{key}}}"

    # -- claim ------------------------------------------------------------------------
    def _args(self, job: Job, token: str) -> list[str]:
        return [token, job.fingerprint or "", self._consuming_ttl, self._retention]

    def _ticket(self, job: Job, token: str, reply: Any) -> Ticket:
        if reply == 1:
            return Ticket(job, Verdict.RUN, token)
        if isinstance(reply, list):
            attempts = _parse(reply[0])[3] + 1
            return Ticket(job, Verdict.TAKEOVER, token, attempts=attempts)
        status, _owner, fp, attempts = _parse(reply)
        verdict = verdict_of_existing(status, fp, job, deadline_passed=False)
        return Ticket(
            job, verdict, attempts=attempts, detail=f"stored fingerprint {fp}" if fp else ""
        )

    def begin(self, job: Job) -> Ticket:
        token = new_token()
        try:
            reply = self._claim([self.record_key(job.namespace, job.key)], self._args(job, token))
        except RedisError as exc:
            raise StoreError(f"redis claim failed: {exc}") from exc
        return self._ticket(job, token, reply)

    def begin_many(self, jobs: Sequence[Job]) -> list[Ticket]:
        token = new_token()  # the batch is one owner
        try:
            replies = self._claim_many.per_key(
                self._names(jobs),
                (self._consuming_ttl, self._retention, token),
                _fingerprints(jobs),
            )
        except RedisError as exc:
            raise StoreError(f"redis batch claim failed: {exc}") from exc
        out = []
        for job, reply in zip(jobs, replies):
            # The common answer inline (a new key); the others through _ticket.
            out.append(
                Ticket(job, Verdict.RUN, token) if reply == 1 else self._ticket(job, token, reply)
            )
        return out

    def _names(self, jobs: Sequence[Job]) -> list[str]:
        prefix = self.prefix
        return [f"{prefix}:{{{job.namespace}:{job.key}}}" for job in jobs]

    def session(self, jobs: Sequence[Job]) -> BatchSession | None:
        """The batch's claims in one script call, its commits in one more."""
        return ClaimAheadSession(self, jobs) if len(jobs) > 1 else None

    # -- commit / release -------------------------------------------------------------
    def commit(self, ticket: Ticket) -> None:
        job = ticket.job
        try:
            done = self._commit(
                [self.record_key(job.namespace, job.key)],
                [ticket.token, self._retention, job.fingerprint or ""],
            )
        except RedisError as exc:
            raise StoreError(f"redis commit failed: {exc}") from exc
        if done != 1:
            raise ClaimLost(f"claim on {job.key!r} was taken over before commit")

    def commit_many(self, tickets: Sequence[Ticket]) -> None:
        lost = []
        for token, group in _by_token(tickets).items():
            jobs = [tickets[i].job for i in group]
            try:
                replies = self._commit_many.per_key(
                    self._names(jobs), (self._retention, token), _fingerprints(jobs)
                )
            except RedisError as exc:
                raise StoreError(f"redis batch commit failed: {exc}") from exc
            lost += [job.key for job, r in zip(jobs, replies) if r != 1]
        if lost:
            raise ClaimLost(f"claims taken over before commit: {lost[:5]}")

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        job = ticket.job
        try:
            self._release([self.record_key(job.namespace, job.key)], [ticket.token])
        except RedisError as exc:
            raise StoreError(f"redis release failed: {exc}") from exc

    def abort_many(self, tickets: Sequence[Ticket], error: BaseException | None) -> None:
        for token, group in _by_token(tickets).items():
            jobs = [tickets[i].job for i in group]
            try:
                self._release_many.per_key(self._names(jobs), (token,), [()] * len(jobs))
            except RedisError as exc:
                raise StoreError(f"redis batch release failed: {exc}") from exc

    # -- inspection -------------------------------------------------------------------
    def get(self, namespace: str, key: str) -> Record | None:
        name = self.record_key(namespace, key)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(name)
            pipe.pttl(name)
            value, pttl = pipe.execute()
        except RedisError as exc:
            raise StoreError(f"redis read failed: {exc}") from exc
        if value is None:
            return None
        status, owner, fp, attempts = _parse(value)
        now = int(time.time() * 1000)
        expires = now + pttl if pttl >= 0 else None
        deadline = expires - self.retention_ms if (status == CONSUMING and expires) else None
        return Record(namespace, key, status, owner, fp, attempts, deadline, expires)

    def close(self) -> None:
        self._commands.close()
        if self._owns_client:
            self.client.close()
