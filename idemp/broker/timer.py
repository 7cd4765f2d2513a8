"""Timer messages: RocketMQ 5's delivery at a given millisecond (``TIMER_DELIVER_MS``).

The store parks them in ``rmq_sys_wheel_timer`` with their real topic and queue in
REAL_TOPIC/REAL_QID (as delay levels park in SCHEDULE_TOPIC_XXXX); this service keeps
their delivery times in a heap and re-stores each under its real topic when due.
Unlike a delay level's queue, the timer queue is not in delivery order, so progress is
"everything below this offset is delivered" plus the delivered offsets above it; after a
restart those above it may be delivered again (at least once, as RocketMQ's timer wheel).

A recalled message (RecallMessage) has a marker in the same queue, due no later than the
message itself (``idemp.broker.v5.recall``): a due marker names the message, which is
then dropped instead of delivered. Markers are read again after a restart with the
messages they name, since both lie above the delivered prefix.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from typing import TYPE_CHECKING

from idemp.remoting.codes import Prop
from idemp.waiting import within

from .schedule import restore_real
from .store import TIMER_DEQUEUE_MS, TIMER_ENQUEUE_MS, TIMER_PRECISION_MS, TIMER_TOPIC

if TYPE_CHECKING:
    from .context import Broker

log = logging.getLogger(__name__)

STATE_FILE = "timerProgress.json"
MAX_IDLE_WAIT_S = 5.0
# a marker is due at most a second before its message; kept longer in case the timer
# runs late, then forgotten (a recall of a message that never existed leaves one behind)
RECALL_KEEP_MS = 60_000


def delete_key(topic: str, message_id: str) -> str:
    """TimerMessageStore.buildDeleteKey: what a marker names and the timer matches."""
    return f"{topic}+{message_id}"


class TimerService:
    def __init__(self, server: Broker) -> None:
        self.server = server
        store = server.store
        assert store is not None
        raw = store.load_state(STATE_FILE).get("done")
        self.done = int(raw) if isinstance(raw, int) else 0
        self.delivered: set[int] = set()
        self.heap: list[tuple[int, int]] = []
        self.recalled: dict[str, int] = {}  # a marker's key -> its due time (ms)
        cq = store.find_queue(TIMER_TOPIC, 0)
        if cq is not None:
            self.done = max(self.done, cq.min_offset)
            for i in range(self.done, cq.max_offset):
                heapq.heappush(self.heap, (cq.tags[i], i))
        self._wake = asyncio.Event()
        store.listeners.append(self._arrived)

    def _arrived(self, topic: str, queue_id: int, max_offset: int, tags_code: int) -> None:
        if topic == TIMER_TOPIC:
            heapq.heappush(self.heap, (tags_code, max_offset - 1))
            self._wake.set()

    def deliver_due(self, now_ms: int) -> tuple[int, float]:
        """Re-store every due message; return (count, seconds until the next one)."""
        store = self.server.store
        assert store is not None
        cq = store.find_queue(TIMER_TOPIC, 0)
        count = 0
        due = []
        while self.heap and self.heap[0][0] <= now_ms:
            when, offset = heapq.heappop(self.heap)
            self.delivered.add(offset)
            if cq is not None and offset >= cq.min_offset:
                msg = store.lookup(cq.phy[offset])
                if msg is None:
                    continue
                marker = msg.properties.get(Prop.TIMER_DEL_UNIQKEY)
                if marker is not None:  # markers first: one may come due with its message
                    self.recalled[marker] = when
                else:
                    due.append(msg)
        for msg in due:
            topic = msg.properties.get(Prop.REAL_TOPIC, msg.topic)
            key = delete_key(topic, msg.properties.get(Prop.UNIQ_KEY, ""))
            if self.recalled.pop(key, None) is not None:
                log.info("timer: %s recalled, not delivered", key)
                continue
            # TimerMessageStore.convert: the wheel's time it entered at, and now
            enqueued = msg.store_timestamp // TIMER_PRECISION_MS * TIMER_PRECISION_MS
            stamps = {TIMER_ENQUEUE_MS: str(enqueued), TIMER_DEQUEUE_MS: str(now_ms)}
            restore_real(store, msg, "timer", stamps)
            count += 1
        if self.recalled:
            stale = [k for k, when in self.recalled.items() if when < now_ms - RECALL_KEEP_MS]
            for k in stale:
                del self.recalled[k]
        moved = self.done
        while self.done in self.delivered:
            self.delivered.discard(self.done)
            self.done += 1
        if self.done != moved:
            store.save_state(STATE_FILE, {"done": self.done})
        wait = (self.heap[0][0] - now_ms) / 1000 if self.heap else MAX_IDLE_WAIT_S
        return count, min(wait, MAX_IDLE_WAIT_S)

    async def run(self) -> None:
        store = self.server.store
        assert store is not None
        while True:
            self._wake.clear()
            count, wait = self.deliver_due(int(time.time() * 1000))
            if count and self.server.config.sync_flush:
                await store.wait_flushed(store.commitlog.end)
            try:
                await within(self._wake.wait(), max(wait, 0.001))
            except TimeoutError:
                pass
