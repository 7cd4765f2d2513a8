"""The orderly runner: RocketMQ's three-lock model (ConsumeMessageOrderlyService).

1. A local lock per MessageQueue: one consume task per queue at a time.
2. The broker lock (LOCK_BATCH_MQ): taken by the consumer core before a queue is
   added, renewed every ``lock_renew_interval`` (20 s); the queue counts as unlocked
   ``lock_expiry`` (30 s) after the last renewal, well before the broker's 60 s. No
   valid lock, no consumption: the runner asks for the lock again later.
3. The ProcessQueue consume lock, held while the listener runs; rebalance takes it
   (1 s timeout) before it gives a queue away.

Batches of ``consume_batch_size`` messages are taken per queue under one lock and run
in order; the listener sees them one by one and the batch stops at the first failure.
Acked messages commit (offset = last + 1); the failed one and the rest go back to the
ProcessQueue and the queue is suspended ``suspend_current_queue_time`` (1 s; a listener's
``ReconsumeLater(after=...)`` picks its own) — the in-memory retry that keeps order. A
message that has failed ``max_reconsume_times`` (default 16; -1 = forever, which is
Java's orderly default) is sent to %DLQ%group and the queue moves on: idemp's default
prefers a dead letter to a stuck queue. A task consuming for longer than
``max_time_consume_continuously`` (60 s) yields.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from idemp.client.processqueue import ProcessQueue
from idemp.client.route import MessageQueue
from idemp.message import ConsumeResult
from idemp.remoting import MessageExt

from .base import RunnerBase

log = logging.getLogger("idemp.runners.orderly")


class OrderlyRunner(RunnerBase):
    """Runs a listener on idemp's client as RocketMQ's orderly consumer does: one message of
    a queue at a time, in queue order, under its three locks (the broker's queue lock, the
    process queue's, the consume lock).

    Built and run like ``ConcurrentRunner``. A failed message is retried in place
    (``suspend_current_queue_time``) so later messages of its queue wait, and goes to the
    group's ``%DLQ%`` after ``max_reconsume_times``; ``shutdown()`` unlocks the queues it
    held.
    """

    orderly = True
    log = log  # idemp.runners.orderly

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mq_locks: dict[MessageQueue, asyncio.Lock] = {}
        self._tasks: set[asyncio.Future[Any]] = set()

    # --- ConsumeService ------------------------------------------------------------
    def dispatch(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if self.stopping or pq.running or pq.dropped:
            return
        pq.running = True
        self._spawn(self._consume_loop(mq, pq))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _later(
        self, mq: MessageQueue, pq: ProcessQueue, delay: float, relock: bool = False
    ) -> None:
        """Resume this queue after ``delay``; ``pq.running`` stays set meanwhile so a
        pull cannot start it early (that would skip the suspension)."""

        def resume() -> None:
            if self.stopping or pq.dropped:
                pq.running = False
                return
            self._spawn(self._relock_then_consume(mq, pq) if relock else self._consume_loop(mq, pq))

        asyncio.get_running_loop().call_later(delay, resume)

    async def _relock_then_consume(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        if not pq.locked or pq.lock_expired(self.settings.lock_expiry):
            if not await self.consumer.lock_one(mq, pq):
                self._later(mq, pq, self.settings.lock_retry_delay, relock=True)
                return
        await self._consume_loop(mq, pq)

    async def _consume_loop(self, mq: MessageQueue, pq: ProcessQueue) -> None:
        s = self.settings
        mq_lock = self._mq_locks.setdefault(mq, asyncio.Lock())
        reschedule: tuple[float, bool] | None = None
        async with mq_lock:  # lock 1: one task per queue
            began = time.monotonic()
            while True:
                if pq.dropped or self.stopping:
                    break
                if self.consumer.clustering and (not pq.locked or pq.lock_expired(s.lock_expiry)):
                    reschedule = (s.lock_retry_delay, True)
                    break
                if time.monotonic() - began > s.max_time_consume_continuously:
                    reschedule = (0.01, False)
                    break
                async with pq.consume_lock:  # lock 3: rebalance waits for this batch
                    if pq.dropped:
                        break
                    exts = pq.take(max(1, s.consume_batch_size))
                    if not exts:
                        break
                    suspend = await self._run_batch(mq, pq, exts)
                if suspend is not None:
                    reschedule = (suspend, False)
                    break
        if reschedule is None:
            pq.running = False
        else:
            self._later(mq, pq, *reschedule)

    async def _run_batch(
        self, mq: MessageQueue, pq: ProcessQueue, exts: list[MessageExt]
    ) -> float | None:
        """Consume one batch in order; return how long the queue must be suspended (the
        failed message's ``ReconsumeLater.after``, else ``suspend_current_queue_time``,
        within Java's 10 ms..30 s), or None to go on."""
        results = await self.call_listener(exts, mq, True)
        pq.last_consume_time = time.monotonic()
        acked = [r is ConsumeResult.SUCCESS for r in results]
        n_ok = len(acked) if all(acked) else acked.index(False)
        ok, rest = exts[:n_ok], exts[n_ok:]
        suspend = False
        pause = self.settings.suspend_current_queue_time
        if rest and n_ok == len(results):  # stopping: the rest were not tried
            suspend = True
        elif rest:
            failed = rest[0]
            given_up = n_ok < len(results) and results[n_ok] is ConsumeResult.DEAD_LETTER
            if given_up or failed.reconsume_times >= self.settings.effective_max_reconsume(True):
                if await self.give_up(failed, mq):
                    ok, rest = exts[: n_ok + 1], exts[n_ok + 1 :]
                else:
                    suspend = True
            else:
                failed.reconsume_times += 1
                suspend = True
                pause = getattr(results[n_ok], "after", None) or pause
        if ok:
            pq.commit(ok)
            self.consumer.commit_offset(mq, ok[-1].queue_offset + 1)
            if self.settings.commit_offset_each_batch and self.consumer.offsets is not None:
                try:
                    await self.consumer.offsets.persist(mq, sync=False)
                except Exception as exc:
                    log.info("offset push of %s failed: %s", mq, exc)
        if rest:
            pq.put_back(rest)
            if not suspend:  # the DLQ'd one moved the queue on; continue at once
                return None
        return min(max(pause, 0.01), 30.0) if suspend else None

    async def service_shutdown(self) -> None:
        """Stop taking batches and wait for the ones in hand."""
        self.stopping = True
        for pq in list(self.consumer.process_queues.values()):
            async with pq.consume_lock:
                pass
        if self._tasks:
            await asyncio.wait(
                list(self._tasks), timeout=self.settings.consume_timeout_minutes * 60
            )
