"""The concurrent runner (ConsumeMessageConcurrentlyService).

Pulled messages are cut into batches of ``consume_batch_size`` and run in the thread
pool (or on the loop for ``async def`` listeners), many batches at once. Acks are per
message (a generalised ack index): failed messages are sent back to the broker
(%RETRY%group, delay level 3 + reconsume times unless the listener's ``ReconsumeLater`` or
the group's ``retry_delay_level`` names one; the broker moves them to %DLQ%group after
``max_reconsume_times``); a send-back that fails is retried in-process 5 s later. The
committed offset is the smallest offset still held, so nothing unconsumed is skipped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from idemp.client.consumer import PushConsumer
from idemp.client.processqueue import ProcessQueue
from idemp.client.route import MessageQueue
from idemp.message import ConsumeResult
from idemp.remoting import MessageExt

from .base import RunnerBase, wait_tasks

log = logging.getLogger("idemp.runners.concurrent")


class ConcurrentRunner(RunnerBase):
    """Runs a listener on idemp's client as RocketMQ's concurrent consumer does.

    ``ConcurrentRunner(listener, namesrv_addr="host:9876", group="g")`` (or full
    ``settings=ConsumerSettings(...)``, ``client=ClientSettings(...)``); then
    ``subscribe(topic, expression="*")``, ``start()`` (returns at once: consuming runs in
    the runner's own thread) and ``shutdown()`` (stops pulling, waits for in-flight
    listeners, commits offsets). Messages of a queue are handled in parallel by
    ``ConsumerSettings.consume_thread_count`` threads; a listener's failure sends the
    message back (``%RETRY%`` topic, then the group's ``%DLQ%`` after
    ``max_reconsume_times``); broadcasting, it is tried again in this instance instead.
    """

    orderly = False
    log = log  # idemp.runners.concurrent

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tasks: set[asyncio.Future[Any]] = set()
        self._cleaner: asyncio.Task[None] | None = None
        self.expired_count = 0  # messages sent back because their listener ran too long

    def service_start(self, consumer: PushConsumer) -> None:
        super().service_start(consumer)
        if consumer.clustering:
            self._cleaner = asyncio.ensure_future(self._clean_expired())

    async def _clean_expired(self) -> None:
        """Every ``consume_timeout_minutes``, send back (delay level 3) the oldest messages
        of each queue whose listener started longer ago than that, and let the queue's
        offset move past them, as Java's cleanExpireMsg does. The listener still running
        is not stopped: its result, when it comes, is the outcome of a delivery already
        given up on (a decorated listener's claim decides what the new copy does)."""
        period = self.settings.consume_timeout_minutes * 60
        loop = asyncio.get_running_loop()
        while not self.stopping:
            await asyncio.sleep(period)
            for mq, pq in list(self.consumer.process_queues.items()):
                for ext in pq.expired(loop.time() - period):
                    if pq.dropped or self.stopping:
                        break
                    if not await self.consumer.send_back(ext, mq, delay_level=3):
                        break  # tried again at the next round
                    self.expired_count += 1
                    log.warning(
                        "%s: %s consumed for over %.0f s: sent back (consume timeout)",
                        mq,
                        ext.msg_id,
                        period,
                    )
                    offset = pq.remove([ext])
                    if not pq.dropped:
                        self.consumer.commit_offset(mq, offset)

    def dispatch(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        if self.stopping:
            return
        n = max(1, self.settings.consume_batch_size)
        for i in range(0, len(msgs), n):
            self._spawn(self._consume(mq, pq, msgs[i : i + n]))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _consume(self, mq: MessageQueue, pq: ProcessQueue, exts: list[MessageExt]) -> None:
        if pq.dropped:
            return
        loop = asyncio.get_running_loop()
        began, started = loop.time(), pq.consume_started
        for e in exts:
            started[e.queue_offset] = began
        results = await self.call_listener(exts, mq, False)
        pq.last_consume_time = loop.time()
        if pq.dropped or len(results) < len(exts):
            # the queue moved on, or the runner stopped mid-batch: its next owner consumes
            # from the committed offset (what ran here is then absorbed as a duplicate)
            return
        failed = [(e, r) for e, r in zip(exts, results) if r is not ConsumeResult.SUCCESS]
        retry_here: list[MessageExt] = []
        if failed and self.consumer.clustering:
            default_level = self.settings.retry_delay_level
            for e, r in failed:
                # DEAD_LETTER: to %DLQ%group at once; a ReconsumeLater's level, or the
                # group's, else 0: the broker's schedule (and its DLQ past the last retry)
                if r is ConsumeResult.DEAD_LETTER:
                    sent = await self.give_up(e, mq, " (listener)")
                else:
                    level = getattr(r, "delay_level", 0) or default_level
                    sent = await self.consumer.send_back(e, mq, delay_level=level)
                if not sent:
                    retry_here.append(e)
        elif failed:
            # Broadcasting: RocketMQ's client drops a failed message (the group's retry
            # topic would reach every instance). Here it is tried again in this instance,
            # as the orderly runner does, and past max reconsume times (or a DeadLetter)
            # goes to %DLQ%<group>, where `idemp dlq list` shows it; the offset waits.
            limit = self.settings.effective_max_reconsume(False)
            for e, r in failed:
                dead = r is ConsumeResult.DEAD_LETTER or e.reconsume_times >= limit
                if not (dead and await self.give_up(e, mq, " (broadcasting)")):
                    retry_here.append(e)
        done = [e for e in exts if e not in retry_here] if retry_here else exts
        offset = pq.remove(done)
        if not pq.dropped:
            self.consumer.commit_offset(mq, offset)
        if retry_here and not self.stopping:
            for e in retry_here:
                e.reconsume_times += 1
            loop.call_later(
                self.settings.send_back_retry_delay,
                lambda: self._spawn(self._consume(mq, pq, retry_here)),
            )

    async def service_shutdown(self) -> None:
        """Let the batches in hand finish (bounded by the consume timeout)."""
        self.stopping = True
        if self._cleaner is not None:
            self._cleaner.cancel()
        await wait_tasks(self._tasks, self.settings.consume_timeout_minutes * 60)
