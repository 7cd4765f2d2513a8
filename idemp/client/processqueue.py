"""ProcessQueue: the messages pulled for one queue and not yet consumed.

Kept sorted by queue offset. The concurrent runner removes what it consumed (the
offset to commit is then the smallest offset still held). The orderly runner *takes*
messages into a separate "consuming" map, then commits them (offset = last + 1) or
puts them back (a failure: they are consumed again, in order). ``consume_lock`` is the
third lock of the orderly model: held while a listener runs, and taken by rebalance
before the queue is given away.
"""

from __future__ import annotations

import asyncio
import bisect
import time

from idemp.remoting import MessageExt


class ProcessQueue:
    def __init__(self) -> None:
        self._offsets: list[int] = []
        self._msgs: dict[int, MessageExt] = {}
        self.consuming: dict[int, MessageExt] = {}
        # concurrent: when each held message's listener last started (loop time), for
        # the expired-message cleaner (Java's CONSUME_START_TIME)
        self.consume_started: dict[int, float] = {}
        self.msg_size = 0
        self.max_offset = -1  # highest offset ever put
        self.broker_max_offset = -1  # the queue's max offset in the broker, at the last pull
        self.dropped = False
        self.locked = False
        self.last_lock_time = 0.0
        self.last_pull_time = time.monotonic()
        self.last_consume_time = time.monotonic()
        self.consume_lock = asyncio.Lock()
        self.running = False  # an orderly consume task is scheduled or running

    # --- shared ------------------------------------------------------------------
    @property
    def msg_count(self) -> int:
        return len(self._msgs) + len(self.consuming)

    def cached_offsets(self) -> list[int]:
        """Offsets cached and not yet handed to a consume thread, ascending."""
        return list(self._offsets)

    def put(self, msgs: list[MessageExt]) -> None:
        for m in msgs:
            off = m.queue_offset
            if off in self._msgs or off in self.consuming:
                continue
            if not self._offsets or off > self._offsets[-1]:
                self._offsets.append(off)
            else:
                bisect.insort(self._offsets, off)
            self._msgs[off] = m
            self.msg_size += len(m.body)
            if off > self.max_offset:
                self.max_offset = off

    @property
    def max_span(self) -> int:
        """Offsets between the oldest and the newest cached message (Java's
        ``getMaxSpan``): one slow message holds the committed offset back while
        everything behind it is consumed; the span bounds what a restart redelivers."""
        return self._offsets[-1] - self._offsets[0] if self._offsets else 0

    def lock_expired(self, expiry: float) -> bool:
        return time.monotonic() - self.last_lock_time > expiry

    def clear(self) -> None:
        self._offsets.clear()
        self._msgs.clear()
        self.consuming.clear()
        self.consume_started.clear()
        self.msg_size = 0

    # --- concurrent --------------------------------------------------------------
    def remove(self, msgs: list[MessageExt]) -> int:
        """Forget consumed messages; return the offset to commit (-1: nothing new)."""
        if not self._msgs and not msgs:
            return -1
        started = self.consume_started
        for m in msgs:
            started.pop(m.queue_offset, None)
            if self._msgs.pop(m.queue_offset, None) is not None:
                self.msg_size -= len(m.body)
                i = bisect.bisect_left(self._offsets, m.queue_offset)
                if i < len(self._offsets) and self._offsets[i] == m.queue_offset:
                    del self._offsets[i]
        return self._offsets[0] if self._offsets else self.max_offset + 1

    def expired(self, started_before: float, limit: int = 16) -> list[MessageExt]:
        """The oldest held messages whose listener started before ``started_before``,
        up to ``limit``, stopping at the first that did not (ProcessQueue.cleanExpiredMsg:
        one stuck listener must not hold the committed offset back for ever)."""
        out: list[MessageExt] = []
        for offset in self._offsets[:limit]:
            began = self.consume_started.get(offset)
            if began is None or began >= started_before:
                break
            out.append(self._msgs[offset])
        return out

    # --- orderly -----------------------------------------------------------------
    def take(self, n: int) -> list[MessageExt]:
        taken = self._offsets[:n]
        del self._offsets[:n]
        out: list[MessageExt] = []
        for off in taken:
            m = self._msgs.pop(off)
            self.consuming[off] = m
            out.append(m)
        return out

    def commit(self, msgs: list[MessageExt]) -> int:
        """The taken ``msgs`` were consumed; return the offset after the last one."""
        for m in msgs:
            if self.consuming.pop(m.queue_offset, None) is not None:
                self.msg_size -= len(m.body)
        if self.consuming:
            return min(self.consuming)
        return max(m.queue_offset for m in msgs) + 1 if msgs else -1

    def put_back(self, msgs: list[MessageExt]) -> None:
        for m in msgs:
            if self.consuming.pop(m.queue_offset, None) is not None:
                self.msg_size -= len(m.body)
        self.put(msgs)

    def has_ready(self) -> bool:
        return bool(self._offsets)
