"""Delay levels: messages parked in SCHEDULE_TOPIC_XXXX (queue = level - 1) are
re-stored under their real topic when due. Progress per level is persisted in
``delayOffset.json`` after the re-stored messages are durable."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from idemp.remoting import MessageExt
from idemp.remoting.codes import SCHEDULE_TOPIC, Prop
from idemp.waiting import within

from .brokerstats import GROUP_GET_NUMS, GROUP_GET_SIZE, QUEUE_GET_NUMS, QUEUE_GET_SIZE
from .send import count_put

if TYPE_CHECKING:
    from .context import Broker
    from .store import MessageStore, PutResult

log = logging.getLogger("idemp.broker.schedule")
STATE_FILE = "delayOffset.json"
SCHEDULE_CONSUMER = "SCHEDULE_CONSUMER"  # MixAll.SCHEDULE_CONSUMER_GROUP
MAX_IDLE_WAIT_S = 5.0


def restore_real(
    store: MessageStore, msg: MessageExt, who: str, added: dict[str, str] | None = None
) -> PutResult | None:
    """Store a parked message (a delay level's or a timer's) again under its real topic
    and queue (REAL_TOPIC/REAL_QID), with the ``added`` properties. The stored property
    string keeps DELAY/REAL_*, as RocketMQ's does."""
    real_topic = msg.properties.get(Prop.REAL_TOPIC)
    if not real_topic:
        log.warning("%s: message at %d has no REAL_TOPIC; dropped", who, msg.commit_log_offset)
        return None
    try:
        real_qid = int(msg.properties.get(Prop.REAL_QID, "0"))
    except ValueError:
        real_qid = 0
    out = MessageExt(
        topic=real_topic,
        queue_id=real_qid,
        body=msg.body,
        flag=msg.flag,
        properties={**msg.properties, **(added or {})},
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
        prepared_transaction_offset=msg.prepared_transaction_offset,
    )
    return store.put(out, keep_wait=True, apply_delay=False)


class ScheduleService:
    def __init__(self, server: Broker) -> None:
        self.server = server
        store = server.store
        assert store is not None
        raw = store.load_state(STATE_FILE).get("offsetTable") or {}
        self.progress: dict[int, int] = {}
        if isinstance(raw, dict):
            self.progress = {int(k): int(v) for k, v in raw.items()}
        self._wake = asyncio.Event()
        self._dirty = False
        store.listeners.append(self._arrived)

    def _arrived(self, topic: str, queue_id: int, max_offset: int, tags_code: int) -> None:
        if topic == SCHEDULE_TOPIC:
            self._wake.set()

    def persist(self) -> None:
        if self._dirty and self.server.store is not None:
            self.server.store.save_state(
                STATE_FILE, {"offsetTable": {str(k): v for k, v in sorted(self.progress.items())}}
            )
            self._dirty = False

    def deliver_due(self, now_ms: int) -> tuple[int, float]:
        """Re-store every due message; return (count, seconds until the next one)."""
        store = self.server.store
        assert store is not None
        delivered = 0
        next_due = MAX_IDLE_WAIT_S
        for level in range(1, len(store.delay_levels) + 1):
            cq = store.find_queue(SCHEDULE_TOPIC, level - 1)
            if cq is None:
                continue
            i = self.progress.get(level, 0)
            while i < cq.max_offset:
                due = cq.tags[i]
                if due > now_ms:
                    next_due = min(next_due, (due - now_ms) / 1000)
                    break
                msg = store.lookup(cq.phy[i])
                if msg is not None:
                    self._restore(msg)
                    delivered += 1
                i += 1
            if i != self.progress.get(level, 0):
                self.progress[level] = i
                self._dirty = True
        return delivered, next_due

    def _restore(self, msg: MessageExt) -> None:
        """Re-store ``msg``, counted as ScheduleMessageService's PutResultProcess counts it
        (enableScheduleMessageStats): a put into the real topic (statsAll's InTPS and
        24-hour count), and a get of SCHEDULE_TOPIC_XXXX (and of its queue) by SCHEDULE_CONSUMER."""
        store = self.server.store
        assert store is not None
        put = restore_real(store, msg, "schedule")
        if put is None:
            return
        size = put.end - put.commit_log_offset
        count_put(self.server, put.topic, 1, size)
        store.stats.add(GROUP_GET_NUMS, f"{SCHEDULE_TOPIC}@{SCHEDULE_CONSUMER}", 1)
        store.stats.add(GROUP_GET_SIZE, f"{SCHEDULE_TOPIC}@{SCHEDULE_CONSUMER}", size)
        queue_key = f"{SCHEDULE_TOPIC}@{msg.queue_id}@{SCHEDULE_CONSUMER}"
        store.stats.add(QUEUE_GET_NUMS, queue_key, 1)
        store.stats.add(QUEUE_GET_SIZE, queue_key, size)

    async def run(self) -> None:
        store = self.server.store
        assert store is not None
        while True:
            self._wake.clear()
            count, wait = self.deliver_due(int(time.time() * 1000))
            if count and self.server.config.sync_flush:
                await store.wait_flushed(store.commitlog.end)
            self.persist()
            try:
                await within(self._wake.wait(), max(wait, 0.001))
            except TimeoutError:
                pass
