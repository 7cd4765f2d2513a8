"""Queue locks for orderly consumers (RebalanceLockManager).

A lock belongs to (group, topic, broker, queue) and one client id; it expires 60 s
after its last renewal, after which any client of the group may take it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

LOCK_MAX_LIVE_MS = 60_000

MQ = tuple[str, str, int]  # topic, brokerName, queueId


@dataclass
class LockEntry:
    client_id: str
    last_update: float

    def expired(self, now: float, max_live_ms: int) -> bool:
        return (now - self.last_update) * 1000 > max_live_ms


class LockManager:
    def __init__(self, max_live_ms: int = LOCK_MAX_LIVE_MS) -> None:
        self.max_live_ms = max_live_ms
        self.table: dict[str, dict[MQ, LockEntry]] = {}

    def try_lock_batch(
        self, group: str, mqs: list[MQ], client_id: str, now: float | None = None
    ) -> list[MQ]:
        now = time.monotonic() if now is None else now
        locks = self.table.setdefault(group, {})
        won: list[MQ] = []
        for mq in mqs:
            entry = locks.get(mq)
            if entry is None:
                locks[mq] = LockEntry(client_id, now)
                won.append(mq)
            elif entry.client_id == client_id:
                entry.last_update = now
                won.append(mq)
            elif entry.expired(now, self.max_live_ms):
                locks[mq] = LockEntry(client_id, now)
                won.append(mq)
        return won

    def unlock_batch(self, group: str, mqs: list[MQ], client_id: str) -> None:
        locks = self.table.get(group)
        if not locks:
            return
        for mq in mqs:
            entry = locks.get(mq)
            if entry is not None and entry.client_id == client_id:
                del locks[mq]

    def holder(self, group: str, mq: MQ, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        entry = self.table.get(group, {}).get(mq)
        if entry is None or entry.expired(now, self.max_live_ms):
            return None
        return entry.client_id
