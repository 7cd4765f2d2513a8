"""The push consumer core: subscriptions, rebalance, long-polling pulls, offsets.

What happens to pulled messages is the business of a ``ConsumeService`` (the runners
in ``idemp.runners``): the core puts them into the queue's ``ProcessQueue`` and hands
them over. For orderly services the core also keeps the broker locks: a queue is
locked before it is added, locks are renewed on a timer, and a queue that leaves is
dropped only once its consume lock is held, its offset persisted and its broker lock
released.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from idemp.message import Message
from idemp.remoting import (
    MessageExt,
    Prop,
    PullSysFlag,
    RequestCode,
    ResponseCode,
    decode_messages,
    offset_msg_id,
    parse_subscription,
)
from idemp.remoting.codes import RETRY_GROUP_TOPIC_PREFIX, strip_namespace, wrap_namespace

from . import running_info
from .instance import ClientInstance
from .offsets import NOT_FOUND, LocalFileOffsetStore, OffsetStore, RemoteOffsetStore
from .processqueue import ProcessQueue
from .rebalance import allocate_average, allocate_consistent_hash
from .route import MessageQueue
from .settings import Allocation, ClientSettings, ConsumeFrom, ConsumerSettings, MessageModel
from .transport import RemotingError, ResponseError

log = logging.getLogger("idemp.client.consumer")

PULL_EXPIRED_S = 120.0


class ConsumeService(Protocol):
    """What a runner provides. All methods run on the client's loop."""

    orderly: bool

    def service_start(self, consumer: PushConsumer) -> None: ...

    def dispatch(self, mq: MessageQueue, pq: ProcessQueue, msgs: list[MessageExt]) -> None: ...

    async def service_shutdown(self) -> None: ...

    async def consume_directly(self, msg: Message) -> tuple[str, str | None]:
        """The listener on one message outside its queue: (CMResult name, remark)."""
        ...


EXPRESSION_TYPES = ("TAG", "SQL92")


@dataclass
class Subscription:
    topic: str
    expression: str
    sub_version: int
    tags: frozenset[str] | None  # None: every message (the broker filters SQL92)
    expression_type: str = "TAG"

    @classmethod
    def build(cls, topic: str, expression: str, expression_type: str = "TAG") -> Subscription:
        if expression_type not in EXPRESSION_TYPES:
            raise ValueError(
                f"expression_type {expression_type!r} is not one of {', '.join(EXPRESSION_TYPES)}"
            )
        if expression_type == "SQL92":
            if not expression.strip():
                raise ValueError(f"an SQL92 subscription to {topic} needs an expression")
            return cls(topic, expression, int(time.time() * 1000), None, "SQL92")
        parsed = parse_subscription(expression)
        return cls(
            topic,
            expression.strip() or "*",
            int(time.time() * 1000),
            None if parsed is None else parsed[0],
        )

    def heartbeat_data(self) -> dict[str, Any]:
        from idemp.remoting import java_string_hash

        tags = sorted(self.tags or ())
        return {
            "topic": self.topic,
            "subString": self.expression,
            "tagsSet": tags,
            "codeSet": [java_string_hash(t) for t in tags],
            "subVersion": self.sub_version,
            "classFilterMode": False,
            "expressionType": self.expression_type,
        }


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


_HOST_HEX: dict[tuple[str, int], str] = {}


def _offset_msg_id(ext: MessageExt) -> str:
    """``offset_msg_id`` with the host part cached (it is the same for a whole pull)."""
    prefix = _HOST_HEX.get(ext.store_host)
    if prefix is None:
        prefix = offset_msg_id(ext.store_host, 0)[:-16]
        _HOST_HEX[ext.store_host] = prefix
    return f"{prefix}{ext.commit_log_offset & 0xFFFFFFFFFFFFFFFF:016X}"


def to_message(ext: MessageExt, mq: MessageQueue, group: str, namespace: str = "") -> Message:
    """The runner-facing ``idemp.Message``; a retried message shows its real topic, and
    a client with a namespace shows it without (ConsumeMessageConcurrentlyService's
    resetRetryAndNamespace)."""
    props = ext.properties
    topic = ext.topic
    real = props.get(Prop.RETRY_TOPIC)
    if real and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        topic = real
    if namespace:
        topic = strip_namespace(namespace, topic)
    raw_keys = props.get(Prop.KEYS)
    offset_id = _offset_msg_id(ext)
    # positional, in the fields' order (keywords cost 0.35 µs a message)
    return Message(
        topic,
        ext.body,
        tuple(k for k in raw_keys.split(" ") if k) if raw_keys else (),  # keys
        props.get(Prop.TAGS),
        MappingProxyType(props),
        props.get(Prop.UNIQ_KEY) or offset_id,  # msg_id
        offset_id,
        ext.queue_id,
        ext.queue_offset,
        mq.broker_name,
        ext.reconsume_times,
        ext.born_timestamp,
        ext.store_timestamp,
        group,  # consumer_group
    )


class PushConsumer:
    def __init__(
        self,
        settings: ConsumerSettings,
        client: ClientSettings,
        service: ConsumeService,
    ) -> None:
        self.settings = settings
        # on the wire, in the client's namespace; the listener's messages name the group
        # as configured (settings.group)
        self.namespace = client.namespace
        self.group = wrap_namespace(client.namespace, settings.group)
        self.client_settings = client
        self.service = service
        self.orderly = service.orderly
        self.subscriptions: dict[str, Subscription] = {}
        self.process_queues: dict[MessageQueue, ProcessQueue] = {}
        self.pull_tasks: dict[MessageQueue, asyncio.Task[None]] = {}
        self.instance: ClientInstance | None = None
        self.offsets: OffsetStore | None = None
        self.started = False
        self.start_timestamp_ms = 0
        self.stopping = False
        self._rebalance_lock: asyncio.Lock | None = None
        self._lock_task: asyncio.Task[None] | None = None
        self.on_queues_changed: Callable[[str, set[MessageQueue]], None] | None = None

    @property
    def clustering(self) -> bool:
        return self.settings.message_model == MessageModel.CLUSTERING

    # --- facade (any thread) ----------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*", expression_type: str = "TAG") -> None:
        """``expression``: tags (``"A || B"``, ``"*"``), or with ``expression_type="SQL92"``
        a selector over the message's properties (``"a > 5 AND TAGS = 'A'"``), which the
        broker evaluates (RocketMQ needs ``enablePropertyFilter=true``; checked at start)."""
        topic = wrap_namespace(self.namespace, topic)
        self.subscriptions[topic] = Subscription.build(topic, expression, expression_type)

    def start(self, timeout: float | None = None) -> None:
        """Connect, register and take queues. Fails with a clear error when no
        nameserver or broker answers within the request timeout."""
        if self.started:
            return
        if not self.subscriptions:
            raise ValueError("subscribe to at least one topic before start()")
        if self.clustering:
            self.subscriptions.setdefault(
                retry_topic(self.group), Subscription.build(retry_topic(self.group), "*")
            )
        self.instance = ClientInstance.acquire(self.client_settings)
        try:
            self.instance.loop_thread.call(self._start(), timeout)
        except BaseException:
            inst, self.instance = self.instance, None
            inst.release()
            raise
        self.started = True
        self.start_timestamp_ms = int(time.time() * 1000)

    def shutdown(self, timeout: float = 90.0) -> None:
        """Finish the batches in hand, persist offsets, unlock queues, unregister."""
        inst = self.instance
        if inst is None:
            return
        try:
            inst.loop_thread.call(self._shutdown(), timeout)
        finally:
            self.instance = None
            self.started = False
            inst.release()

    # --- loop side ----------------------------------------------------------------
    async def _check_filters(self) -> None:
        """CHECK_CLIENT_CONFIG for each SQL92 subscription, at each broker of its topic,
        as the Java consumer asks at start: a broker that does not filter by properties,
        or an expression it cannot compile, is an error now rather than an empty stream."""
        inst = self.instance
        assert inst is not None
        for sub in self.subscriptions.values():
            if sub.expression_type == "TAG":
                continue
            route = inst.routes.get(sub.topic)
            names = {q.broker_name for q in route.subscribe_queues()} if route else set()
            for name in sorted(names):
                addr = inst.master_addr(name)
                if addr is None:
                    continue
                body = {
                    "clientId": inst.client_id,
                    "group": self.group,
                    "subscriptionData": sub.heartbeat_data(),
                }
                resp = await inst.broker_call(
                    addr, RequestCode.CHECK_CLIENT_CONFIG, {}, json.dumps(body).encode()
                )
                if resp.code != ResponseCode.SUCCESS:
                    raise ValueError(
                        f"{self.group}: broker {name} refuses the SQL92 subscription to "
                        f"{sub.topic} ({sub.expression!r}): {resp.remark} (code {resp.code})"
                    )

    async def _start(self) -> None:
        inst = self.instance
        assert inst is not None
        self._rebalance_lock = asyncio.Lock()
        if self.clustering:
            self.offsets = RemoteOffsetStore(inst, self.group)
        else:
            self.offsets = LocalFileOffsetStore(
                self.settings.offset_store_dir,
                f"{inst.settings.client_ip}@{inst.settings.instance_name}",
                self.group,
            )
        await self.offsets.load()
        for topic in self.subscriptions:
            # Unreachable servers raise here (a clear error at start); a topic that does
            # not exist yet is only logged: rebalance picks it up once it is created.
            route = await inst.update_route(topic)
            if route is None and not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                log.warning("%s: topic %s does not exist (yet)", self.group, topic)
        if self.group in inst.consumers:
            raise ValueError(f"consumer group {self.group} is already running in this process")
        await self._check_filters()
        inst.consumers[self.group] = self
        self.service.service_start(self)
        try:
            await inst.heartbeat_all(acl_refusal_raises=True)
        except ResponseError:
            del inst.consumers[self.group]
            raise
        if self.orderly and self.clustering:
            self._lock_task = asyncio.ensure_future(self._renew_locks())
        await self.rebalance()

    async def _shutdown(self) -> None:
        inst = self.instance
        assert inst is not None and self.offsets is not None
        self.stopping = True
        inst.consumers.pop(self.group, None)
        if self._lock_task is not None:
            self._lock_task.cancel()
        for task in self.pull_tasks.values():
            task.cancel()  # no more pulls; a pull in flight is dropped with its messages
        # The runner starts nothing new and waits for the handlers in hand; their results
        # are committed (as RocketMQ's shutdown does) before the queues are dropped.
        await self.service.service_shutdown()
        for pq in self.process_queues.values():
            pq.dropped = True
        await asyncio.gather(*self.pull_tasks.values(), return_exceptions=True)
        await self.offsets.persist_all(list(self.process_queues), sync=True)
        if self.orderly and self.clustering:
            await inst.unlock_batch(self.group, list(self.process_queues))
        self.process_queues.clear()
        await inst.unregister(consumer_group=self.group)

    # --- instance callbacks ---------------------------------------------------------
    def topics(self) -> list[str]:
        return list(self.subscriptions)

    def heartbeat_data(self) -> dict[str, Any]:
        return {
            "groupName": self.group,
            "consumeType": "CONSUME_PASSIVELY",
            "messageModel": self.settings.message_model.value,
            "consumeFromWhere": self.settings.consume_from.value,
            "unitMode": False,
            "subscriptionDataSet": [s.heartbeat_data() for s in self.subscriptions.values()],
        }

    def running_info(self) -> dict[str, Any]:
        """ConsumerRunningInfo, the consumer's part (``running_info.encode`` adds the
        instance's): its settings under the Java consumer's names, its subscriptions and
        each queue it holds."""
        s = self.settings
        threads = str(s.consume_thread_count)
        properties = {
            "consumerGroup": self.group,
            "messageModel": s.message_model.value,
            "consumeFromWhere": s.consume_from.value,
            "consumeThreadMin": threads,
            "consumeThreadMax": threads,
            "consumeMessageBatchMaxSize": str(s.consume_batch_size),
            "pullBatchSize": str(s.pull_batch_size),
            "pullThresholdForQueue": str(s.pull_threshold_for_queue),
            "pullThresholdSizeForQueue": str(s.pull_threshold_size_for_queue_mb),
            "consumeConcurrentlyMaxSpan": str(s.consume_concurrently_max_span),
            "maxReconsumeTimes": str(s.max_reconsume_times),
            "suspendCurrentQueueTimeMillis": str(int(s.suspend_current_queue_time * 1000)),
            "consumeTimeout": str(int(s.consume_timeout_minutes)),
            "namesrvAddr": self.client_settings.namesrv_addr,
            "instanceName": self.client_settings.instance_name,
            "clientIP": self.client_settings.client_ip,
            running_info.PROP_CONSUME_ORDERLY: str(self.orderly).lower(),
            running_info.PROP_THREADPOOL_CORE_SIZE: threads,
            running_info.PROP_CONSUMER_START_TIMESTAMP: str(self.start_timestamp_ms),
        }
        queues = [
            (mq, pq, self.offsets.read_memory(mq) if self.offsets else None)
            for mq, pq in self.process_queues.items()
        ]
        return {
            "properties": properties,
            "subscriptionSet": [s.heartbeat_data() for s in self.subscriptions.values()],
            "mqTable": running_info.queue_table(queues),
            "statusTable": {},
        }

    async def consume_directly(self, ext: MessageExt, broker_name: str) -> dict[str, Any]:
        """CONSUME_MESSAGE_DIRECTLY (``mqadmin queryMsgById -g -d``, the dashboard's
        resend): ConsumeMessageDirectlyResult. The message's queue, offset and retries are
        not touched; a decorated listener deduplicates it as any other delivery."""
        mq = MessageQueue(ext.topic, broker_name, ext.queue_id)
        msg = to_message(ext, mq, self.settings.group, self.namespace)
        began = time.monotonic()
        result, remark = await self.service.consume_directly(msg)
        return {
            "order": self.orderly,
            "autoCommit": True,
            "consumeResult": result,
            "remark": remark,
            "spentTimeMills": int((time.monotonic() - began) * 1000),
        }

    async def persist_offsets(self) -> None:
        if self.offsets is not None and not self.stopping:
            await self.offsets.persist_all(list(self.process_queues))

    async def reset_offsets(
        self, topic: str, timestamp: int, offsets: dict[MessageQueue, int] | None = None
    ) -> None:
        """RESET_CONSUMER_CLIENT_OFFSET: drop the topic's queues; the offsets the request
        carries (a Java admin's reset by time) are committed first, so the next rebalance
        takes the queues again from there (without them: from what the broker stored)."""
        for mq, pq in list(self.process_queues.items()):
            if mq.topic == topic:
                pq.dropped = True
                self.process_queues.pop(mq, None)
        if self.offsets is not None:
            for mq, offset in (offsets or {}).items():
                self.offsets.update(mq, offset, increase_only=False)
                try:
                    await self.offsets.persist(mq, sync=True)
                except RemotingError as exc:
                    log.warning("reset of %s to %d not committed: %s", mq, offset, exc)
            for mq in [m for m in list(self.offsets.table) if m.topic == topic]:
                self.offsets.remove(mq)
        if self.instance is not None:
            self.instance.wake_rebalance()

    # --- rebalance -------------------------------------------------------------------
    async def rebalance(self) -> None:
        if self.stopping or self._rebalance_lock is None:
            return
        async with self._rebalance_lock:
            for topic in list(self.subscriptions):
                try:
                    await self._rebalance_topic(topic)
                except RemotingError as exc:
                    log.info("rebalance %s/%s: %s", self.group, topic, exc)

    async def _rebalance_topic(self, topic: str) -> None:
        inst = self.instance
        assert inst is not None
        route = inst.routes.get(topic) or await inst.update_route(topic)
        if route is None:
            return
        mqs = route.subscribe_queues()
        if self.clustering:
            cids = await inst.consumer_ids(self.group, topic)
            if inst.client_id not in cids:
                log.info("rebalance %s: client id %s not in the group yet", topic, inst.client_id)
                return
            alloc_fn = (
                allocate_consistent_hash
                if self.settings.allocation == Allocation.CONSISTENT_HASH
                else allocate_average
            )
            wanted = set(alloc_fn(self.group, inst.client_id, mqs, cids))
        else:
            wanted = set(mqs)
        changed = await self._update_process_queues(topic, wanted)
        if changed and self.on_queues_changed is not None:
            self.on_queues_changed(topic, {mq for mq in self.process_queues if mq.topic == topic})

    async def _update_process_queues(self, topic: str, wanted: set[MessageQueue]) -> bool:
        changed = False
        now = time.monotonic()
        for mq, pq in list(self.process_queues.items()):
            if mq.topic != topic:
                continue
            if mq not in wanted or (not self.orderly and now - pq.last_pull_time > PULL_EXPIRED_S):
                pq.dropped = True
                if await self._remove_queue(mq, pq):
                    changed = True
        new = sorted(mq for mq in wanted if mq not in self.process_queues)
        if new and self.orderly and self.clustering:
            assert self.instance is not None
            won = await self.instance.lock_batch(self.group, new)
            new = [mq for mq in new if mq in won]
        for mq in new:
            offset = await self._compute_pull_from(mq)
            # A rebalance that was under way when shutdown began must not start pull
            # loops that shutdown has already passed (nothing would stop them).
            if offset < 0 or self.stopping:
                if self.orderly and self.clustering:
                    assert self.instance is not None
                    await self.instance.unlock_batch(self.group, [mq])
                continue
            pq = ProcessQueue()
            if self.orderly and self.clustering:
                pq.locked = True
                pq.last_lock_time = time.monotonic()
            self.process_queues[mq] = pq
            self.pull_tasks[mq] = asyncio.ensure_future(self._pull_loop(mq, pq, offset))
            changed = True
            log.info("%s: took %s from offset %d", self.group, mq, offset)
        return changed

    async def _remove_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Give a queue away. Orderly: only while holding its consume lock (1 s try),
        so no batch runs; then persist its offset and unlock it at the broker at once."""
        assert self.offsets is not None and self.instance is not None
        got_lock = False
        if self.orderly and self.clustering:
            try:
                await asyncio.wait_for(
                    pq.consume_lock.acquire(), self.settings.drop_consume_lock_timeout
                )
                got_lock = True
            except asyncio.TimeoutError:
                log.info("%s: %s is consuming; will drop it later", self.group, mq)
                return False
        try:
            task = self.pull_tasks.pop(mq, None)
            if task is not None:
                task.cancel()
            try:
                await self.offsets.persist(mq, sync=True)
            except RemotingError as exc:
                log.info("offset persist of %s failed: %s", mq, exc)
                if self.orderly and self.clustering:
                    pq.dropped = False  # keep it (and its lock): nothing was lost yet
                    return False
            self.offsets.remove(mq)
            self.process_queues.pop(mq, None)
            pq.clear()
            if self.orderly and self.clustering:
                await self.instance.unlock_batch(self.group, [mq])
            log.info("%s: dropped %s", self.group, mq)
            return True
        finally:
            if got_lock:
                pq.consume_lock.release()

    async def _compute_pull_from(self, mq: MessageQueue) -> int:
        """CONSUME_FROM_* when no offset is stored (RebalancePushImpl)."""
        assert self.offsets is not None and self.instance is not None
        last = await self.offsets.read_store(mq)
        if last >= 0:
            return last
        if last != NOT_FOUND:
            return -1
        is_retry = mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        mode = self.settings.consume_from
        try:
            if mode == ConsumeFrom.FIRST_OFFSET or (is_retry and mode == ConsumeFrom.LAST_OFFSET):
                return 0
            if mode == ConsumeFrom.LAST_OFFSET or is_retry:
                return await self._queue_offset(mq, RequestCode.GET_MAX_OFFSET)
            ts = self.settings.consume_timestamp_ms
            if ts is None:
                ts = int(time.time() * 1000) - 30 * 60 * 1000
            return await self._queue_offset(mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, ts)
        except RemotingError as exc:
            log.info("offset lookup of %s failed: %s", mq, exc)
            return -1

    async def _queue_offset(self, mq: MessageQueue, code: int, timestamp: int | None = None) -> int:
        assert self.instance is not None
        addr = self.instance.master_addr(mq.broker_name)
        if addr is None:
            raise RemotingError(f"no master for {mq.broker_name}")
        ext = {"topic": mq.topic, "queueId": str(mq.queue_id)}
        if timestamp is not None:
            ext["timestamp"] = str(timestamp)
        resp = await self.instance.broker_call(addr, code, ext)
        if resp.code != ResponseCode.SUCCESS:
            raise ResponseError(resp.code, resp.remark, f"offset of {mq}")
        return int(resp.ext_fields.get("offset", "0"))

    # --- locks (orderly) ---------------------------------------------------------------
    async def _renew_locks(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lock_renew_interval)
            try:
                await self.lock_all()
            except Exception as exc:
                log.warning("lock renewal failed: %s", exc)

    async def lock_all(self) -> None:
        """LOCK_BATCH_MQ for every queue held; a queue not granted stops consuming."""
        assert self.instance is not None
        # Every queue still in the table, dropped ones included: a queue whose drop
        # waits for its running batch (consume lock busy) must keep its broker lock
        # until that batch ends, or another process takes it mid-batch (Java's
        # lockAll renews the whole processQueueTable for the same reason).
        mqs = list(self.process_queues)
        if not mqs:
            return
        won = await self.instance.lock_batch(self.group, mqs)
        now = time.monotonic()
        for mq in mqs:
            pq = self.process_queues.get(mq)
            if pq is None:
                continue
            if mq in won:
                was = pq.locked
                pq.locked = True
                pq.last_lock_time = now
                if not was and pq.has_ready():
                    self.service.dispatch(mq, pq, [])
            else:
                pq.locked = False

    async def lock_one(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        assert self.instance is not None
        won = await self.instance.lock_batch(self.group, [mq])
        if mq in won:
            pq.locked = True
            pq.last_lock_time = time.monotonic()
            return True
        pq.locked = False
        return False

    # --- pulling -----------------------------------------------------------------------
    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, offset: int) -> None:
        s = self.settings
        inst = self.instance
        assert inst is not None and self.offsets is not None
        sub = self.subscriptions.get(mq.topic)
        if sub is None:
            return
        size_limit = s.pull_threshold_size_for_queue_mb * 1024 * 1024
        next_offset = offset
        while not pq.dropped and not self.stopping:
            if (
                pq.msg_count > s.pull_threshold_for_queue
                or pq.msg_size > size_limit
                or (not self.orderly and pq.max_span > s.consume_concurrently_max_span)
            ):
                await asyncio.sleep(s.pull_time_delay_when_flow_control)
                continue
            if self.orderly and self.clustering and not pq.locked:
                await asyncio.sleep(s.lock_retry_delay)
                continue
            pq.last_pull_time = time.monotonic()
            commit = self.offsets.read_memory(mq)
            flag = PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION
            if commit is not None and commit > 0:
                flag |= PullSysFlag.COMMIT_OFFSET
            ext = {
                "consumerGroup": self.group,
                "topic": mq.topic,
                "queueId": str(mq.queue_id),
                "queueOffset": str(next_offset),
                "maxMsgNums": str(s.pull_batch_size),
                "sysFlag": str(flag),
                "commitOffset": str(commit or 0),
                "suspendTimeoutMillis": str(s.suspend_timeout_ms),
                "subscription": sub.expression,
                "subVersion": str(sub.sub_version),
                "expressionType": sub.expression_type,
            }
            addr = inst.master_addr(mq.broker_name)
            try:
                if addr is None:
                    raise RemotingError(f"no address for broker {mq.broker_name}")
                resp = await inst.broker_call(
                    addr, RequestCode.PULL_MESSAGE, ext, timeout=s.pull_timeout
                )
            except RemotingError as exc:
                if pq.dropped:
                    return
                log.info("pull %s failed: %s", mq, exc)
                await asyncio.sleep(s.pull_time_delay_when_exception)
                try:
                    await inst.update_route(mq.topic)
                except RemotingError:
                    pass
                continue
            if pq.dropped:
                return
            f = resp.ext_fields
            if "maxOffset" in f:
                pq.broker_max_offset = int(f["maxOffset"])
            if resp.code == ResponseCode.SUCCESS:
                next_offset = int(f.get("nextBeginOffset", next_offset))
                try:
                    msgs = decode_messages(resp.body)
                except ValueError as exc:
                    log.error("undecodable pull result from %s: %s", mq, exc)
                    await asyncio.sleep(s.pull_time_delay_when_exception)
                    continue
                if sub.tags is not None:
                    msgs = [m for m in msgs if m.tags in sub.tags]
                if msgs:
                    pq.put(msgs)
                    self.service.dispatch(mq, pq, msgs)
                elif pq.msg_count == 0:
                    self.offsets.update(mq, next_offset)
            elif resp.code in (ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY):
                next_offset = int(f.get("nextBeginOffset", next_offset))
                if pq.msg_count == 0 and next_offset > 0:
                    self.offsets.update(mq, next_offset)
            elif resp.code == ResponseCode.PULL_OFFSET_MOVED:
                moved = int(f.get("nextBeginOffset", next_offset))
                log.warning("%s: offset %d moved to %d", mq, next_offset, moved)
                next_offset = moved
                self.offsets.update(mq, moved, increase_only=False)
                try:
                    await self.offsets.persist(mq, sync=True)
                except RemotingError:
                    pass
            else:
                log.info("pull %s: %s", mq, ResponseError(resp.code, resp.remark))
                await asyncio.sleep(s.pull_time_delay_when_exception)

    # --- send-back ---------------------------------------------------------------------
    async def send_back(self, msg: MessageExt, mq: MessageQueue, delay_level: int = 0) -> bool:
        """CONSUMER_SEND_MSG_BACK: the broker re-stores the message in %RETRY%group
        (delay 3 + reconsumeTimes) or, past max reconsume times or with a negative
        delay level, in %DLQ%group."""
        inst = self.instance
        if inst is None:
            return False
        addr = inst.master_addr(mq.broker_name)
        if addr is None:
            return False
        real_topic = msg.properties.get(Prop.RETRY_TOPIC) or msg.topic
        try:
            resp = await inst.broker_call(
                addr,
                RequestCode.CONSUMER_SEND_MSG_BACK,
                {
                    "offset": str(msg.commit_log_offset),
                    "group": self.group,
                    "delayLevel": str(delay_level),
                    "originMsgId": msg.msg_id,
                    "originTopic": real_topic,
                    "unitMode": "false",
                    "maxReconsumeTimes": str(self.settings.effective_max_reconsume(self.orderly)),
                },
            )
        except RemotingError as exc:
            log.info("send-back of %s failed: %s", msg.msg_id, exc)
            return False
        if resp.code != ResponseCode.SUCCESS:
            log.info("send-back of %s refused: %s %s", msg.msg_id, resp.code, resp.remark)
            return False
        return True

    def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        if offset >= 0 and self.offsets is not None:
            self.offsets.update(mq, offset)
