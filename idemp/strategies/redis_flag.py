"""Redis flag with TTL: CONSUMING with a processing deadline, then CONSUMED for the
retention period. One Lua round trip per claim, whatever the answer (new, duplicate,
in progress, taken over), and one per commit or release; batches are pipelined (per
node on Redis Cluster: see ``_redis``).

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

from idemp.strategies._redis import LuaScript, connect, describe
from idemp.strategies.base import (
    CONSUMED,
    CONSUMING,
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

# KEYS[1] record; ARGV: token, fingerprint, CONSUMING ttl ms, retention ms.
# → 1 (claimed a new key, or already ours: a re-run of this very claim after a lost
# reply), {old value} (took over past the deadline), or the stored value.
CLAIM = """
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'C|' .. ARGV[1] .. '|' .. ARGV[2] .. '|1', 'PX', ARGV[3])
  return 1
end
if string.byte(v, 1) == 67 then
  local mine = 'C|' .. ARGV[1] .. '|'
  if string.sub(v, 1, #mine) == mine then return 1 end
  if redis.call('PTTL', KEYS[1]) <= tonumber(ARGV[4]) then
    local n = tonumber(string.match(v, '|(%d+)$')) or 1
    redis.call('SET', KEYS[1], 'C|' .. ARGV[1] .. '|' .. ARGV[2] .. '|' .. (n + 1), 'PX', ARGV[3])
    return {v}
  end
end
return v
"""

# KEYS[1]; ARGV: token, retention ms, fingerprint. Owner only: CONSUMING → CONSUMED.
# A record lost with the server (restart without persistence) is written again, since
# the effect happened. → 1 committed (or already), 0 the claim belongs to someone else.
COMMIT = """
local v = redis.call('GET', KEYS[1])
local mine = 'C|' .. ARGV[1] .. '|'
if v and string.sub(v, 1, #mine) == mine then
  redis.call('SET', KEYS[1], 'D' .. string.sub(v, 2), 'PX', ARGV[2])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], 'D|' .. ARGV[1] .. '|' .. ARGV[3] .. '|1', 'PX', ARGV[2])
  return 1
end
if string.sub(v, 1, #mine) == 'D' .. string.sub(mine, 2) then
  return 1
end
return 0
"""

# KEYS[1]; ARGV: token. Owner only: delete a CONSUMING record. → 1 released, 0 not ours.
RELEASE = """
local v = redis.call('GET', KEYS[1])
local mine = 'C|' .. ARGV[1] .. '|'
if v and string.sub(v, 1, #mine) == mine then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def _parse(value: bytes) -> tuple[str, str, str | None, int]:
    """(status, owner, fingerprint, attempts) of a stored value."""
    flag, owner, fp, attempts = value.decode().split("|")
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
        self._claim = LuaScript(self.client, CLAIM)
        self._commit = LuaScript(self.client, COMMIT)
        self._release = LuaScript(self.client, RELEASE)
        self._consuming_ttl = str(self.deadline_ms + self.retention_ms)
        self._retention = str(self.retention_ms)

    def __repr__(self) -> str:
        from idemp.config import mask_url  # lazy: config imports the strategies

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
        tokens = [new_token() for _ in jobs]
        calls = [
            ((self.record_key(job.namespace, job.key),), self._args(job, token))
            for job, token in zip(jobs, tokens)
        ]
        try:
            replies = self._claim.many(calls)
        except RedisError as exc:
            raise StoreError(f"redis batch claim failed: {exc}") from exc
        return [self._ticket(job, token, r) for job, token, r in zip(jobs, tokens, replies)]

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
        calls = [
            (
                (self.record_key(t.job.namespace, t.job.key),),
                (t.token, self._retention, t.job.fingerprint or ""),
            )
            for t in tickets
        ]
        try:
            replies = self._commit.many(calls)
        except RedisError as exc:
            raise StoreError(f"redis batch commit failed: {exc}") from exc
        lost = [t.job.key for t, r in zip(tickets, replies) if r != 1]
        if lost:
            raise ClaimLost(f"claims taken over before commit: {lost[:5]}")

    def abort(self, ticket: Ticket, error: BaseException | None) -> None:
        job = ticket.job
        try:
            self._release([self.record_key(job.namespace, job.key)], [ticket.token])
        except RedisError as exc:
            raise StoreError(f"redis release failed: {exc}") from exc

    def abort_many(self, tickets: Sequence[Ticket], error: BaseException | None) -> None:
        calls = [((self.record_key(t.job.namespace, t.job.key),), (t.token,)) for t in tickets]
        try:
            self._release.many(calls)
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
        if self._owns_client:
            self.client.close()
