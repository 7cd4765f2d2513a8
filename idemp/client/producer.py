"""Producer: sync, batch, delayed, orderly (by sharding key) and transactional sends.

The core is asyncio (``AsyncProducer``, on the client instance's loop); ``Producer``
is the blocking facade. Queue choice: round-robin over the topic's publish queues,
skipping the broker of the previous failed attempt; orderly sends use
``std::hash(key) % queues`` (see ``sharding``) and are never retried on another queue,
since that would break the key's order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import enum
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from idemp.message import Message
from idemp.remoting import (
    BatchEntry,
    MessageExt,
    MessageSysFlag,
    Prop,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    UniqKeyGenerator,
    encode_batch,
    encode_properties,
    parse_offset_msg_id,
)
from idemp.remoting.codes import REPLY_MESSAGE_FLAG, strip_namespace, wrap_namespace
from idemp.remoting.message import compress_body

from .instance import ClientInstance
from .route import MessageQueue
from .settings import ClientSettings, ProducerSettings
from .sharding import queue_index_for_key
from .trace import (
    DELAY,
    NORMAL,
    TRANSACTION_HALF,
    TraceDispatcher,
    end_transaction_record,
    now_ms,
    pub_record,
    trace_keys,
)
from .transport import Connection, RemotingError, ResponseError

log = logging.getLogger("idemp.client.producer")

_SENT_CODES = {
    ResponseCode.SUCCESS,
    ResponseCode.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE,
}


class SendError(RemotingError):
    pass


class ReplyTimeout(RemotingError):
    """A request was sent, but no reply came within its timeout."""


class SendStatus(str, enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


class TransactionState(enum.IntEnum):
    """Values are END_TRANSACTION's commitOrRollback."""

    UNKNOWN = 0
    COMMIT = 8
    ROLLBACK = 12


# Java's LocalTransactionState names, as an EndTransaction trace record gives them
_JAVA_STATE = {
    TransactionState.UNKNOWN: "UNKNOW",
    TransactionState.COMMIT: "COMMIT_MESSAGE",
    TransactionState.ROLLBACK: "ROLLBACK_MESSAGE",
}


@dataclass
class OutMessage:
    """A message to send. ``delay_level`` 1..18 maps to the broker's messageDelayLevel."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] = field(default_factory=dict)
    delay_level: int = 0
    flag: int = 0

    def wire_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.keys:
            props[Prop.KEYS] = " ".join(self.keys)
        if self.tags:
            props[Prop.TAGS] = self.tags
        if self.delay_level > 0:
            props[Prop.DELAY] = str(self.delay_level)
        return props


def create_reply(request: Message, body: bytes) -> OutMessage:
    """The reply to ``request`` (MessageUtil.createReplyMessage): to the requester's
    cluster's reply topic, with its correlation id, client id and time to live."""
    cluster = request.property(Prop.CLUSTER)
    if cluster is None:
        raise ValueError(
            f"cannot reply to message {request.msg_id}: it has no {Prop.CLUSTER} property "
            "(only messages stored by a broker do)"
        )
    props = {Prop.MSG_TYPE: REPLY_MESSAGE_FLAG}
    for name in (Prop.CORRELATION_ID, Prop.REPLY_TO_CLIENT, Prop.TTL):
        value = request.property(name)
        if value is not None:
            props[name] = value
    return OutMessage(f"{cluster}_REPLY_TOPIC", body, properties=props)


@dataclass
class SendResult:
    status: SendStatus
    msg_id: str  # UNIQ_KEY (comma-joined for a batch)
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    transaction_state: TransactionState | None = None
    # the broker's region and trace switch (MSG_REGION, TRACE_ON) and address: a trace's
    region_id: str | None = None
    trace_on: bool = True
    broker_addr: str = ""


LocalTransaction = Callable[[OutMessage, SendResult], TransactionState]
TransactionCheck = Callable[[MessageExt], TransactionState]


class AsyncProducer:
    def __init__(
        self,
        settings: ProducerSettings,
        instance: ClientInstance,
        check: TransactionCheck | None = None,
        namespace: str = "",
    ) -> None:
        self.settings = settings
        self.namespace = namespace
        self.group = wrap_namespace(namespace, settings.group)
        self.instance = instance
        self.check = check
        self.ids = UniqKeyGenerator(instance.settings.client_ip)
        self._rr = itertools.count()

    # --- queue selection ---------------------------------------------------------
    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        route = await self.instance.route(
            topic, self.settings.create_topic_key, self.settings.default_topic_queue_nums
        )
        queues = route.publish_queues()
        if not queues:
            raise SendError(f"topic {topic} has no writable queue")
        return queues

    def _pick(self, queues: list[MessageQueue], avoid: str | None) -> MessageQueue:
        for _ in range(len(queues)):
            mq = queues[next(self._rr) % len(queues)]
            if mq.broker_name != avoid:
                return mq
        return queues[next(self._rr) % len(queues)]

    # --- sending -----------------------------------------------------------------
    async def send(
        self,
        msg: OutMessage,
        *,
        queue: MessageQueue | None = None,
        sharding_key: str | None = None,
        transactional: bool = False,
        trace: bool = True,
    ) -> SendResult:
        """``trace``: False for the trace producer's own sends."""
        began = time.time()
        uniq, props, code, ext, body, fixed = await self._prepare(
            msg, queue, sharding_key, transactional
        )
        result = await self._send_with_retry(msg.topic, code, ext, body, fixed)
        result.msg_id = uniq
        if (
            trace
            and self.settings.enable_trace
            and msg.topic != self.settings.trace_topic
            and result.region_id
            and result.trace_on
        ):
            kind = DELAY if msg.delay_level > 0 else NORMAL
            self._trace(msg, props, result, began, TRANSACTION_HALF if transactional else kind)
        return result

    async def send_oneway(self, msg: OutMessage, queue: MessageQueue | None = None) -> str:
        """CommunicationMode.ONEWAY: one attempt and no answer (so no retry, and no
        trace record: the Java client writes one only from a send's result). The
        message's UNIQ_KEY, the id a consumer sees, is returned."""
        uniq, _, code, ext, body, fixed = await self._prepare(msg, queue, None, False)
        mq = fixed or self._pick(await self.publish_queues(msg.topic), None)
        addr = self._address(mq, ext)
        try:
            await self.instance.broker_oneway(addr, code, ext, body)
        except RemotingError as exc:
            raise SendError(f"oneway send to {mq} failed: {exc}") from exc
        return uniq

    async def _prepare(
        self,
        msg: OutMessage,
        queue: MessageQueue | None,
        sharding_key: str | None,
        transactional: bool,
    ) -> tuple[str, dict[str, str], int, dict[str, str], bytes, MessageQueue | None]:
        """A send's id, properties, request code, header, body and fixed queue."""
        props = msg.wire_properties()
        # kept when the message has one (a message sent again), as the Java client does
        uniq = props.setdefault(Prop.UNIQ_KEY, self.ids.next_id())
        props.setdefault(Prop.WAIT, "true")
        sys_flag = 0
        if transactional:
            props[Prop.TRAN_MSG] = "true"
            props[Prop.PGROUP] = self.group
            sys_flag |= MessageSysFlag.TRANSACTION_PREPARED
        body = msg.body
        if len(body) >= self.settings.compress_over:
            body, sys_flag = compress_body(body, sys_flag)
        if len(msg.body) > self.settings.max_message_size:
            raise SendError(
                f"message body of {len(msg.body)} bytes exceeds {self.settings.max_message_size}"
            )
        fixed: MessageQueue | None = queue
        if sharding_key is not None:
            queues = await self.publish_queues(msg.topic)
            fixed = queues[queue_index_for_key(sharding_key, len(queues))]
            props[Prop.SHARDING_KEY] = sharding_key
        ext = {
            "a": self.group,
            "b": msg.topic,
            "c": self.settings.create_topic_key,
            "d": str(self.settings.default_topic_queue_nums),
            "f": str(sys_flag),
            "h": str(msg.flag),
            "i": encode_properties(props),
            "j": "0",
            "k": "false",
        }
        # a reply (create_reply) goes as SEND_REPLY_MESSAGE_V2, as the Java client sends it
        code = (
            RequestCode.SEND_REPLY_MESSAGE_V2
            if props.get(Prop.MSG_TYPE) == REPLY_MESSAGE_FLAG
            else RequestCode.SEND_MESSAGE_V2
        )
        return uniq, props, code, ext, body, fixed

    def _trace(
        self, msg: OutMessage, props: dict[str, str], result: SendResult, began: float, kind: int
    ) -> None:
        """SendMessageTraceHookImpl: a Pub record once the broker answered."""
        keys = props.get(Prop.KEYS)
        record = pub_record(
            timestamp_ms=int(began * 1000),
            region=result.region_id or "",
            group=self.group,
            topic=msg.topic,
            msg_id=result.msg_id,
            tags=msg.tags,
            keys=keys,
            store_host=result.broker_addr,
            body_length=len(msg.body),
            cost_ms=int((time.time() - began) * 1000),
            msg_type=kind,
            offset_msg_id=result.offset_msg_id,
            success=result.status is SendStatus.SEND_OK,
        )
        tracer(self.instance, self.settings.trace_topic).append(
            record, trace_keys(result.msg_id, keys)
        )

    async def request(self, msg: OutMessage, timeout: float) -> Any:
        """DefaultMQProducerImpl.request: send with a correlation id, this client's id
        and a time to live, then wait for the reply the broker pushes back."""
        correlation = uuid.uuid4().hex
        props = {
            **msg.properties,
            Prop.CORRELATION_ID: correlation,
            Prop.REPLY_TO_CLIENT: self.instance.client_id,
            Prop.TTL: str(int(timeout * 1000)),
        }
        began = time.monotonic()
        if msg.topic not in self.instance.routes:
            # the broker must know this client as a producer before the reply arrives
            await self.publish_queues(msg.topic)
            await self.instance.heartbeat_all()
        waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.instance.replies[correlation] = waiting
        try:
            await self.send(dataclasses.replace(msg, properties=props))
            left = timeout - (time.monotonic() - began)
            return await asyncio.wait_for(waiting, max(left, 0.001))
        except asyncio.TimeoutError:
            raise ReplyTimeout(
                f"sent the request to {msg.topic}, but no reply came within {timeout} s"
            ) from None
        finally:
            self.instance.replies.pop(correlation, None)

    async def send_batch(
        self, msgs: Sequence[OutMessage], queue: MessageQueue | None = None
    ) -> SendResult:
        """One request, one queue (``queue``, or round robin); every message gets its own
        UNIQ_KEY. A fixed queue keeps the batch's order within that queue (orderly)."""
        if not msgs:
            raise ValueError("an empty batch")
        topic = msgs[0].topic
        entries: list[BatchEntry] = []
        ids: list[str] = []
        for m in msgs:
            if m.topic != topic:
                raise ValueError("all messages of a batch must have the same topic")
            if m.delay_level > 0:
                raise ValueError("batch messages may not be delayed")
            props = m.wire_properties()
            uniq = props.setdefault(Prop.UNIQ_KEY, self.ids.next_id())
            props.setdefault(Prop.WAIT, "true")
            ids.append(uniq)
            entries.append(BatchEntry(m.body, props, m.flag))
        body = encode_batch(entries)
        ext = {
            "a": self.group,
            "b": topic,
            "c": self.settings.create_topic_key,
            "d": str(self.settings.default_topic_queue_nums),
            "f": "0",
            "h": "0",
            "i": "",
            "j": "0",
            "k": "false",
            "m": "true",
        }
        result = await self._send_with_retry(
            topic, RequestCode.SEND_BATCH_MESSAGE, ext, body, queue
        )
        result.msg_id = ",".join(ids)
        return result

    async def _send_with_retry(
        self, topic: str, code: int, ext: dict[str, str], body: bytes, fixed: MessageQueue | None
    ) -> SendResult:
        attempts = 1 if fixed is not None else 1 + self.settings.retry_times_when_send_failed
        deadline = time.monotonic() + self.settings.send_timeout
        avoid: str | None = None
        errors: list[str] = []
        for attempt in range(attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            mq: MessageQueue | None = fixed
            try:
                if mq is None:
                    mq = self._pick(await self.publish_queues(topic), avoid)
                return await self._send_to(mq, code, dict(ext), body, remaining)
            except RemotingError as exc:
                errors.append(f"attempt {attempt + 1}: {exc}")
                avoid = mq.broker_name if mq is not None else None
                if isinstance(exc, ResponseError) and exc.code in (
                    ResponseCode.MESSAGE_ILLEGAL,
                    ResponseCode.NO_PERMISSION,
                ):
                    break
                # A fresh route may move us off a dead broker.
                try:
                    await self.instance.update_route(
                        topic,
                        self.settings.create_topic_key,
                        self.settings.default_topic_queue_nums,
                    )
                except RemotingError:
                    pass
        raise SendError(f"send to {topic} failed: " + "; ".join(errors or ["timeout"]))

    def _address(self, mq: MessageQueue, ext: dict[str, str]) -> str:
        """The queue's master, and the header's queue id and born time for it."""
        addr = self.instance.master_addr(mq.broker_name)
        if addr is None:
            raise SendError(f"no master address for broker {mq.broker_name}")
        ext["e"] = str(mq.queue_id)
        ext["g"] = str(int(time.time() * 1000))
        return addr

    async def _send_to(
        self, mq: MessageQueue, code: int, ext: dict[str, str], body: bytes, timeout: float
    ) -> SendResult:
        addr = self._address(mq, ext)
        resp = await self.instance.broker_call(addr, code, ext, body, timeout)
        if resp.code not in _SENT_CODES:
            raise ResponseError(resp.code, resp.remark, f"send to {mq}")
        status = {
            ResponseCode.SUCCESS: SendStatus.SEND_OK,
            ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
            ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
            ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
        }[ResponseCode(resp.code)]
        f = resp.ext_fields
        return SendResult(
            status=status,
            msg_id="",
            offset_msg_id=f.get("msgId", ""),
            queue=MessageQueue(mq.topic, mq.broker_name, int(f.get("queueId", mq.queue_id))),
            queue_offset=int(f.get("queueOffset", "-1")),
            transaction_id=f.get("transactionId") or None,
            region_id=f.get(Prop.MSG_REGION),
            trace_on=f.get(Prop.TRACE_ON) != "false",
            broker_addr=addr,
        )

    # --- transactions ------------------------------------------------------------
    async def end_transaction(
        self,
        result: SendResult,
        state: TransactionState,
        addr: str | None = None,
        from_check: bool = False,
        msg: OutMessage | None = None,
    ) -> None:
        """``msg``: the half message as sent, for its EndTransaction trace record."""
        commit_log_offset = parse_offset_msg_id(result.offset_msg_id)[1]
        target = addr or self.instance.master_addr(result.queue.broker_name)
        if target is None:
            raise SendError(f"no master address for broker {result.queue.broker_name}")
        if msg is not None:
            keys = " ".join(msg.keys) if msg.keys else None
            self._trace_end(
                msg.topic, msg.properties.get(Prop.MSG_REGION), msg.tags, keys,
                result.msg_id, target, state, from_check,
            )  # fmt: skip
        await self.instance.broker_oneway(
            target,
            RequestCode.END_TRANSACTION,
            {
                "producerGroup": self.group,
                "tranStateTableOffset": str(result.queue_offset),
                "commitLogOffset": str(commit_log_offset),
                "commitOrRollback": str(int(state)),
                "fromTransactionCheck": "true" if from_check else "false",
                "msgId": result.msg_id,
                "transactionId": result.transaction_id or result.msg_id,
            },
        )

    def _trace_end(
        self,
        topic: str,
        region: str | None,
        tags: str | None,
        keys: str | None,
        msg_id: str,
        broker_addr: str,
        state: TransactionState,
        from_check: bool,
    ) -> None:
        """EndTransactionTraceHookImpl. The transaction id it records is the message's
        UNIQ_KEY, which the Java client takes as the transaction id on both paths."""
        if not self.settings.enable_trace or topic.startswith(self.settings.trace_topic):
            return
        record = end_transaction_record(
            timestamp_ms=now_ms(),
            region=region,
            group=self.group,
            topic=topic,
            msg_id=msg_id,
            tags=tags,
            keys=keys,
            store_host=broker_addr,
            transaction_id=msg_id,
            state=_JAVA_STATE[state],
            from_check=from_check,
        )
        tracer(self.instance, self.settings.trace_topic).append(record, trace_keys(msg_id, keys))

    async def check_transaction(self, conn: Connection, cmd: RemotingCommand) -> None:
        """Answer a broker's CHECK_TRANSACTION_STATE with END_TRANSACTION (oneway)."""
        from idemp.remoting import decode_messages

        if self.check is None:
            log.warning("transaction check for group %s but no check callback", self.group)
            return
        msg = decode_messages(cmd.body)[0]
        wire_topic = msg.topic
        msg.topic = strip_namespace(self.namespace, wire_topic)  # as the check sent it
        loop = asyncio.get_running_loop()
        try:
            state = await loop.run_in_executor(None, self.check, msg)
        except Exception:
            log.exception("transaction check callback failed; answering UNKNOW")
            state = TransactionState.UNKNOWN
        f = cmd.ext_fields
        msg_id = msg.uniq_key or f.get("msgId", "")
        props = msg.properties
        self._trace_end(
            wire_topic, props.get(Prop.MSG_REGION), props.get(Prop.TAGS), props.get(Prop.KEYS),
            msg_id, conn.addr, state, True,
        )  # fmt: skip
        await self.instance.broker_oneway(
            conn.addr,
            RequestCode.END_TRANSACTION,
            {
                "producerGroup": self.group,
                "tranStateTableOffset": f.get("tranStateTableOffset", "0"),
                "commitLogOffset": f.get("commitLogOffset", "0"),
                "commitOrRollback": str(int(state)),
                "fromTransactionCheck": "true",
                "msgId": msg_id,
                "transactionId": f.get("transactionId", msg.uniq_key or ""),
            },
        )


class Producer:
    """Blocking facade: ``Producer(namesrv, group).start()``; ``send``; ``shutdown``."""

    def __init__(
        self,
        namesrv_addr: str | None = None,
        group: str = "DEFAULT_PRODUCER",
        *,
        settings: ProducerSettings | None = None,
        client: ClientSettings | None = None,
        transaction_check: TransactionCheck | None = None,
    ) -> None:
        self.settings = settings or ProducerSettings(group=group)
        self.client_settings = client or ClientSettings()
        if namesrv_addr:
            self.client_settings.namesrv_addr = namesrv_addr
        self.transaction_check = transaction_check
        self.instance: ClientInstance | None = None
        self.core: AsyncProducer | None = None

    def start(self) -> Producer:
        self.instance = ClientInstance.acquire(self.client_settings)
        self.core = AsyncProducer(
            self.settings, self.instance, self.transaction_check, self.client_settings.namespace
        )
        self.instance.producers[self.core.group] = self.core
        return self

    # A namespace (ClientSettings.namespace) is added to the topics sent to and taken off
    # the queues answered, here at the facade, as the Java client's producer does.
    def _out(self, msg: OutMessage) -> OutMessage:
        topic = wrap_namespace(self.client_settings.namespace, msg.topic)
        return msg if topic == msg.topic else dataclasses.replace(msg, topic=topic)

    def _out_queue(self, queue: MessageQueue | None) -> MessageQueue | None:
        if queue is None or not self.client_settings.namespace:
            return queue
        topic = wrap_namespace(self.client_settings.namespace, queue.topic)
        return MessageQueue(topic, queue.broker_name, queue.queue_id)

    def _back(self, queue: MessageQueue) -> MessageQueue:
        if not self.client_settings.namespace:
            return queue
        topic = strip_namespace(self.client_settings.namespace, queue.topic)
        return MessageQueue(topic, queue.broker_name, queue.queue_id)

    def _result(self, result: SendResult) -> SendResult:
        result.queue = self._back(result.queue)
        return result

    def _call(self, coro: Any) -> Any:
        if self.instance is None:
            coro.close()
            raise RuntimeError("producer is not started")
        return self.instance.loop_thread.call(coro)

    def _core(self) -> AsyncProducer:
        if self.core is None:
            raise RuntimeError("producer is not started")
        return self.core

    def send(self, msg: OutMessage, queue: MessageQueue | None = None) -> SendResult:
        core = self._core()
        result: SendResult = self._call(core.send(self._out(msg), queue=self._out_queue(queue)))
        return self._result(result)

    def send_async(
        self, msg: OutMessage, queue: MessageQueue | None = None
    ) -> concurrent.futures.Future[SendResult]:
        """``send`` without waiting: the future holds its result (or its SendError),
        and callbacks added to it run on the client's I/O thread, so keep them short."""
        if self.instance is None:
            raise RuntimeError("producer is not started")
        sent = self._core().send(self._out(msg), queue=self._out_queue(queue))
        future = self.instance.loop_thread.submit(sent)
        if not self.client_settings.namespace:
            return future
        plain: concurrent.futures.Future[SendResult] = concurrent.futures.Future()

        def done(f: concurrent.futures.Future[SendResult]) -> None:
            error = f.exception()
            if error is not None:
                plain.set_exception(error)
            else:
                plain.set_result(self._result(f.result()))

        future.add_done_callback(done)
        return plain

    def send_oneway(self, msg: OutMessage, queue: MessageQueue | None = None) -> str:
        """Send without waiting for the broker's answer: one attempt, nothing reported
        back (a lost message is not seen). Returns the message's id (UNIQ_KEY)."""
        msg_id: str = self._call(self._core().send_oneway(self._out(msg), self._out_queue(queue)))
        return msg_id

    def request(self, msg: OutMessage, timeout: float = 3.0) -> Message:
        """Send ``msg`` and wait for its reply (a consumer answers with ``create_reply``);
        ReplyTimeout when none comes within ``timeout`` seconds."""
        reply: Message = self._call(self._core().request(self._out(msg), timeout))
        return reply

    def send_orderly(self, msg: OutMessage, sharding_key: str) -> SendResult:
        """The queue is ``std::hash(sharding_key) % queues``, as the official client."""
        core = self._core()
        result: SendResult = self._call(core.send(self._out(msg), sharding_key=sharding_key))
        return self._result(result)

    def send_batch(
        self, msgs: Sequence[OutMessage], queue: MessageQueue | None = None
    ) -> SendResult:
        wire = [self._out(m) for m in msgs]
        result: SendResult = self._call(self._core().send_batch(wire, self._out_queue(queue)))
        return self._result(result)

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues (for ``send_batch(msgs, queue)`` by sharding key)."""
        topic = wrap_namespace(self.client_settings.namespace, topic)
        queues: list[MessageQueue] = self._call(self._core().publish_queues(topic))
        return [self._back(q) for q in queues]

    def send_in_transaction(self, msg: OutMessage, local: LocalTransaction) -> SendResult:
        """Half message, then ``local(msg, result)`` in this thread, then commit/rollback."""
        if self.core is None:
            raise RuntimeError("producer is not started")
        core = self.core
        wire = self._out(msg)
        result: SendResult = self._result(self._call(core.send(wire, transactional=True)))
        try:
            state = local(msg, result)
        except Exception:
            log.exception("local transaction raised; rolling back")
            state = TransactionState.ROLLBACK
        self._call(core.end_transaction(result, state, msg=wire))
        result.transaction_state = state
        return result

    def shutdown(self) -> None:
        if self.instance is None:
            return
        inst = self.instance
        group = self.core.group if self.core is not None else self.settings.group
        inst.producers.pop(group, None)
        try:
            inst.loop_thread.call(inst.unregister(producer_group=group), timeout=10)
        except Exception as exc:
            log.info("unregister failed: %s", exc)
        self.instance = None
        self.core = None
        inst.release()

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def tracer(instance: ClientInstance, topic: str) -> TraceDispatcher:
    """The instance's trace dispatcher for ``topic``, made at first use with a producer of
    its own (group ``_INNER_TRACE_PRODUCER-<topic>``, messages up to 128,000 bytes)."""
    found = instance.tracers.get(topic)
    if found is None:
        settings = ProducerSettings(group=f"_INNER_TRACE_PRODUCER-{topic}")
        settings.max_message_size = 128_000
        producer = AsyncProducer(settings, instance)

        async def send(trace_topic: str, body: bytes, keys: list[str]) -> None:
            await producer.send(OutMessage(trace_topic, body, keys=keys), trace=False)

        found = instance.tracers[topic] = TraceDispatcher(topic, send, instance.settings.client_ip)
    return found
