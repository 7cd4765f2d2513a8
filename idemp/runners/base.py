"""What both runners share: the consumer they drive and how a listener is called."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from idemp.client.consumer import PushConsumer, to_message
from idemp.client.processqueue import ProcessQueue
from idemp.client.producer import tracer
from idemp.client.route import MessageQueue
from idemp.client.settings import ClientSettings, ConsumerSettings
from idemp.client.trace import DeliveryTrace
from idemp.message import Answer, ConsumeResult, Message, answer_of, consume_result_of
from idemp.remoting import MessageExt

log = logging.getLogger("idemp.runners")

Listener = Callable[[Message], Any]


#: RocketMQ's placeholder group: its clients refuse to consume with it (checkConfig).
DEFAULT_CONSUMER_GROUP = "DEFAULT_CONSUMER"


def check_group(host: str, group: str | None) -> None:
    """Fail when the consumer is built, not per message: the group names the offsets, the
    retry and DLQ topics, and the default namespace of the dedup records."""
    if not group or group == DEFAULT_CONSUMER_GROUP:
        raise ValueError(
            f"{host}: no consumer group: pass group=... (or ConsumerSettings(group=...)); "
            f"RocketMQ refuses the placeholder {DEFAULT_CONSUMER_GROUP!r} too"
        )


def is_async_listener(listener: Listener) -> bool:
    return inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
        getattr(listener, "__call__", None)  # noqa: B004 - a callable object's method
    )


def _call_sync(
    listener: Listener,
    exts: list[MessageExt],
    mq: MessageQueue,
    stop_on_failure: bool,
    runner: RunnerBase,
) -> list[Answer]:
    # the messages are built here, in the listener's thread, not on the client's loop:
    # the loop then holds the GIL less often while the listener's thread runs, and the
    # two contend less (measured: ~4 % more messages a second in the end-to-end suite)
    group, namespace = runner.settings.group, runner.consumer.namespace
    msgs = [to_message(e, mq, group, namespace) for e in exts]
    batch = getattr(listener, "consume_batch", None)
    if batch is not None and len(msgs) > 1:
        # a decorated listener: one store transaction (or round trip) for the batch
        try:
            got = batch(msgs, stop_on_failure=stop_on_failure, stopping=lambda: runner.stopping)
            return [answer_of(r) for r in got]
        except Exception:  # nothing it made stick is lost: the batch comes back, deduped
            log.exception("batch listener raised on %d messages (reconsume later)", len(msgs))
            return [ConsumeResult.RECONSUME_LATER] * (1 if stop_on_failure else len(msgs))
    out: list[Answer] = []
    for m in msgs:
        if runner.stopping:  # shutting down: start nothing new; the rest come back
            break
        try:
            answer: Answer = answer_of(listener(m))
        except Exception:
            log.exception("listener raised on %s (reconsume later)", m.msg_id)
            answer = ConsumeResult.RECONSUME_LATER
        out.append(answer)
        if answer is not ConsumeResult.SUCCESS and stop_on_failure:
            break
    return out


class RunnerBase:
    """Builds the PushConsumer and owns the listener's thread pool."""

    orderly = False
    log = log  # each runner's own logger

    def __init__(
        self,
        listener: Listener,
        *,
        namesrv_addr: str | None = None,
        group: str | None = None,
        settings: ConsumerSettings | None = None,
        client: ClientSettings | None = None,
    ) -> None:
        self.listener = listener
        self.dlq_count = 0  # messages this runner sent to the group's %DLQ%
        self.settings = settings or ConsumerSettings()
        if group:
            self.settings.group = group
        check_group(type(self).__name__, self.settings.group)
        level = self.settings.retry_delay_level
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            raise ValueError(
                f"{type(self).__name__}: ConsumerSettings.retry_delay_level={level!r}: "
                "a delay level is 1 or more, or 0 for the broker's schedule"
            )
        self.client_settings = client or ClientSettings()
        if namesrv_addr:
            self.client_settings.namesrv_addr = namesrv_addr
        self.is_async = is_async_listener(listener)
        self.executor: ThreadPoolExecutor | None = None
        self.consumer = PushConsumer(self.settings, self.client_settings, self)
        self.stopping = False
        self._async_slots: asyncio.Semaphore | None = None

    # --- facade ------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """Tags, or an SQL92 selector over properties (see PushConsumer.subscribe)."""
        self.consumer.subscribe(topic, expression, expression_type)

    def start(self, timeout: float | None = None) -> None:
        self.consumer.start(timeout)

    def shutdown(self, timeout: float = 90.0) -> None:
        try:
            self.consumer.shutdown(timeout)
        finally:
            if self.executor is not None:
                self.executor.shutdown(wait=False)

    def __enter__(self) -> RunnerBase:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- ConsumeService ------------------------------------------------------------
    def service_start(self, consumer: PushConsumer) -> None:
        self.executor = ThreadPoolExecutor(
            self.settings.consume_thread_count, thread_name_prefix="idemp-consume"
        )
        self._async_slots = asyncio.Semaphore(self.settings.consume_thread_count)

    def dispatch(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None:
        raise NotImplementedError

    async def service_shutdown(self) -> None:
        raise NotImplementedError

    async def give_up(self, msg: MessageExt, mq: MessageQueue, note: str = "") -> bool:
        """Send ``msg`` to the group's %DLQ% (delay level -1), past its last attempt;
        counted and logged. False when the broker did not take it (tried again later)."""
        if not await self.consumer.send_back(msg, mq, delay_level=-1):
            return False
        self.dlq_count += 1
        tries = msg.reconsume_times + 1
        self.log.warning("%s: %s went to the DLQ after %d attempts%s", mq, msg.msg_id, tries, note)
        return True

    async def call_listener(
        self, exts: list[MessageExt], mq: MessageQueue, stop_on_failure: bool
    ) -> list[Answer]:
        """One result per message tried; with ``stop_on_failure`` the list ends at the
        first one not acked (the rest were not given to the listener). Once the runner
        is stopping no further message is started: the list is then shorter, and the
        messages not tried are neither acked nor sent back (they are redelivered from
        the committed offset)."""
        if not self.settings.enable_trace:
            return await self._call_listener(exts, mq, stop_on_failure)
        inst = self.consumer.instance
        assert inst is not None
        trace = DeliveryTrace(tracer(inst, self.settings.trace_topic), self.settings.group, exts)
        results = await self._call_listener(exts, mq, stop_on_failure)
        trace.done([r is ConsumeResult.SUCCESS for r in results])
        return results

    async def _call_listener(
        self, exts: list[MessageExt], mq: MessageQueue, stop_on_failure: bool
    ) -> list[Answer]:
        if not self.is_async:
            assert self.executor is not None
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self.executor, _call_sync, self.listener, exts, mq, stop_on_failure, self
            )
        assert self._async_slots is not None
        group, namespace = self.settings.group, self.consumer.namespace
        msgs = [to_message(e, mq, group, namespace) for e in exts]
        out: list[Answer] = []
        async with self._async_slots:
            for m in msgs:
                if self.stopping:
                    break
                try:
                    result = self.listener(m)
                    if inspect.isawaitable(result):
                        result = await result
                    got = answer_of(result)
                except Exception:
                    log.exception("listener raised on %s (reconsume later)", m.msg_id)
                    got = ConsumeResult.RECONSUME_LATER
                out.append(got)
                if got is not ConsumeResult.SUCCESS and stop_on_failure:
                    break
        return out

    async def consume_directly(self, msg: Message) -> tuple[str, str | None]:
        """The listener on one message an operator sent (RocketMQ's CMResult names):
        acked or not, or what it raised."""
        try:
            if self.is_async:
                result = self.listener(msg)
                if inspect.isawaitable(result):
                    result = await result
            else:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self.executor, self.listener, msg)
            got = consume_result_of(result)
        except Exception as exc:
            log.exception("listener raised on %s (consumed directly)", msg.msg_id)
            return "CR_THROW_EXCEPTION", f"{type(exc).__name__}: {exc}"
        # a decorated listener's outcome says more than the ack: DUPLICATE, FAILED: why
        outcome, error = getattr(result, "outcome", None), getattr(result, "error", None)
        said = [outcome.name] if outcome is not None else []
        if error is not None:
            said.append(f"{type(error).__name__}: {error}")
        remark = ": ".join(said) or (None if got is ConsumeResult.SUCCESS else got.name)
        return ("CR_SUCCESS" if got is ConsumeResult.SUCCESS else "CR_LATER"), remark


async def wait_tasks(tasks: set[asyncio.Future[Any]], timeout: float) -> None:
    if tasks:
        await asyncio.wait(list(tasks), timeout=timeout)
