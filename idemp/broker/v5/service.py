"""``apache.rocketmq.v2.MessagingService`` on idemp's broker: what RocketMQ 5's proxy serves.

Requests are answered as RocketMQ 5.3.3's proxy answers them (``proxy/.../grpc/v2``):
errors are a ``Status`` inside the response with the proxy's code and words, never a
broken call; RPCs idemp does not serve (PullMessage, UpdateOffset, GetOffset,
QueryOffset) get gRPC's UNIMPLEMENTED, as the proxy's generated base does.
Everything runs on the broker's event loop, beside the remoting handlers, on one store.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.duration_pb2 import Duration

from idemp.remoting.codes import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    TRANS_HALF_TOPIC,
    MessageSysFlag,
    Prop,
)
from idemp.remoting.javahash import java_string_hash
from idemp.remoting.message import MessageExt, MessageFormatError
from idemp.remoting.sql92 import SelectorError, compile_selector
from idemp.remoting.tags import SubscriptionSplitError, tag_subscription, tags_code

from ..diskguard import DiskFull
from ..halfcheck import STORE_REFUSED
from ..metadata import Perm, grpc_group_error, grpc_topic_error
from ..send import illegal_text
from ..store import TIMER_DELIVER_MS, TIMER_TOPIC
from ..timer import delete_key
from .cluster import ClusterView
from .convert import SYSTEM_KEYS, message_type_of, timestamp, to_proto, to_stored
from .pop import HandleError, MalformedHandle, OffsetOutside, PopService, Receipt
from .recall import RECALL_TAG, build_handle, parse_handle, refusal
from .schema import Code, pb, status

if TYPE_CHECKING:
    from ..context import Broker

log = logging.getLogger("idemp.broker.v5")

# ProxyConfig defaults of RocketMQ 5.3.3
MIN_LONG_POLL_MS = 5_000
MAX_LONG_POLL_MS = 20_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
RECEIVE_BATCH = 32
CLIENT_EXPIRY_S = 120  # the proxy's channelExpiredTimeout
PRODUCER_MAX_ATTEMPTS = 3
# ProxyConfig of RocketMQ 5.3.3: maxDelayTimeMills, maxTransactionRecoverySecond,
# maxMessageGroupSize (in UTF-8 bytes, and a group must stay under it)
MAX_DELAY_MS = 24 * 3600 * 1000
MAX_RECOVERY_S = 3600
_PROXY = "org.apache.rocketmq.proxy.common.ProxyException: "
# what LocalTopicRouteService meets for a topic the broker lacks, where it is not asked
# first whether there is one (a receive; a send to a retry or DLQ topic)
_NO_TOPIC_CONFIG = (
    'Cannot invoke "org.apache.rocketmq.common.TopicConfig.getPerm()" because "topicConfig" '
    "is null. NullPointerException. org.apache.rocketmq.proxy.service.route"
    ".LocalTopicRouteService.toTopicRouteData(LocalTopicRouteService.java:83)"
)
# protobuf's Timestamp range (Timestamps.checkValid, run by Timestamps.toMillis)
_TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)
_UNPARSED: set[str] = set()  # SQL92 filters said not to compile (in the log)
NO_TRANSACTION_DATA = _PROXY + "cannot found transaction data"
MESSAGE_GROUP_MAX = 64
USER_PROPERTY_MAX_NUM = 128
USER_PROPERTY_MAX_SIZE = 16 * 1024
# the default CustomizedRetryPolicy of a group: 1s 5s 10s 30s 1m 2m ... 2h
RETRY_NEXT_MS = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
]  # fmt: skip


class RequestError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Rpc:
    """One RPC: how it streams ("unary", "server_stream", "bidi"), the coroutine (or
    async generator) that serves it with ``(request or requests, call)``, and its
    message types. The call offers what grpc.aio's context does and the service reads:
    ``invocation_metadata()``, ``time_remaining()``, ``peer()``, ``abort(code, details)``."""

    kind: str
    fn: Callable[..., Any]
    request: Any
    response: Any


@dataclass
class ClientState:
    client_id: str
    settings: Any = None
    group: str = ""
    kind: int = 0
    telemetry: asyncio.Queue[Any] | None = None
    topics: set[str] = field(default_factory=set)
    last_seen: float = field(default_factory=time.monotonic)


def _duration(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _ms(d: Any) -> int:
    return int(d.seconds) * 1000 + int(d.nanos) // 1_000_000


def consistent_hash(value: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash``: the proxy puts a message group in this queue."""
    state = value & 0xFFFFFFFFFFFFFFFF
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        shifted = state >> 33  # 31 bits: Java's (int) of it stays positive
        nxt = int((candidate + 1) / ((shifted + 1) / float(1 << 31)))
        if 0 <= nxt < buckets:
            candidate = nxt
        else:
            return candidate


class MessagingService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        assert broker.store is not None
        self.store = broker.store
        config = broker.config
        self.pop = PopService(
            broker.store,
            config.brokerName,
            lambda: config.popFromRetryProbability,
            journal=broker.store.root / "pop" / "journal",
        )
        self.cluster = ClusterView(broker)
        self.clients: dict[str, ClientState] = {}
        # set when a client appears: the revive loop sleeps on it while there is
        # nothing to revive, renew or expire (an idle broker wakes no more than it must)
        self.client_arrived = asyncio.Event()
        self.endpoint: tuple[str, int] = (broker.config.brokerIP1, 0)
        cluster = broker.config.brokerClusterName
        self.system_topics = {cluster, broker.config.brokerName, f"{cluster}_REPLY_TOPIC"}
        self._rr = random.randrange(1 << 16)
        # the proxy's TransactionDataManager: (topic, transaction id) -> the half's commit
        # log offset and when the entry expires; EndTransaction takes its entry
        self._tx_data: dict[tuple[str, str], tuple[int, float]] = {}
        broker.transactions.checkers.append(self.check_transaction)

    def _remember_tx(self, topic: str, transaction_id: str, phy: int) -> None:
        now = time.monotonic()
        data = self._tx_data
        while data:  # in expiry order (one keep time for all): the first live one ends it
            oldest = next(iter(data))
            if data[oldest][1] >= now:
                break
            del data[oldest]
        data.pop((topic, transaction_id), None)  # to the end, with its new expiry
        keep_s = self.broker.config.transactionDataExpireMillis / 1000
        data[(topic, transaction_id)] = (phy, now + keep_s)

    def _take_tx(self, topic: str, transaction_id: str) -> int | None:
        phy, expires = self._tx_data.pop((topic, transaction_id), (-1, 0.0))
        return phy if expires >= time.monotonic() else None

    def check_transaction(self, half: Any, transaction_id: str) -> bool:
        """Ask a 5.x producer of the half's topic (the proxy uses the topic as producer
        group) over its Telemetry stream; False when none is connected."""
        for client in self.clients.values():
            if client.telemetry is not None and half.topic in client.topics:
                self._remember_tx(half.topic, transaction_id, half.commit_log_offset)
                command = pb.RecoverOrphanedTransactionCommand(
                    message=to_proto(half, None, half.reconsume_times + 1),
                    transaction_id=transaction_id,
                )
                client.telemetry.put_nowait(
                    pb.TelemetryCommand(recover_orphaned_transaction_command=command)
                )
                return True
        return False

    # --- plumbing ---------------------------------------------------------------------
    def rpcs(self) -> dict[str, Rpc]:
        """The RPCs served, by name; the endpoint puts them on the wire. Any other method
        of the service gets the protocol's UNIMPLEMENTED."""

        def unary(fn: Any, req: Any) -> Rpc:
            resp = getattr(pb, req.DESCRIPTOR.name.replace("Request", "Response"))
            return Rpc("unary", _guarded(fn, resp), req, resp)

        return {
            "QueryRoute": unary(self.query_route, pb.QueryRouteRequest),
            "Heartbeat": unary(self.heartbeat, pb.HeartbeatRequest),
            "SendMessage": unary(self.send_message, pb.SendMessageRequest),
            "QueryAssignment": unary(self.query_assignment, pb.QueryAssignmentRequest),
            "ReceiveMessage": Rpc(
                "server_stream",
                self.receive_message,
                pb.ReceiveMessageRequest,
                pb.ReceiveMessageResponse,
            ),
            "AckMessage": unary(self.ack_message, pb.AckMessageRequest),
            "ForwardMessageToDeadLetterQueue": unary(
                self.forward_to_dlq, pb.ForwardMessageToDeadLetterQueueRequest
            ),
            "EndTransaction": unary(self.end_transaction, pb.EndTransactionRequest),
            "Telemetry": Rpc("bidi", self.telemetry, pb.TelemetryCommand, pb.TelemetryCommand),
            "NotifyClientTermination": unary(
                self.notify_termination, pb.NotifyClientTerminationRequest
            ),
            "ChangeInvisibleDuration": unary(
                self.change_invisible, pb.ChangeInvisibleDurationRequest
            ),
            "RecallMessage": unary(self.recall_message, pb.RecallMessageRequest),
        }

    def _client(self, context: Any) -> ClientState:
        meta = dict(context.invocation_metadata() or ())
        client_id = meta.get("x-mq-client-id", "")
        if not client_id:
            raise RequestError(Code.CLIENT_ID_REQUIRED, "client id cannot be empty")
        state = self.clients.get(client_id)
        if state is None:
            state = self.clients[client_id] = ClientState(client_id)
            self.client_arrived.set()
        state.last_seen = time.monotonic()
        return state

    def _known_topic(self, resource: Any) -> Any:
        """The topic's config, or None when the broker has no such topic (a valid name)."""
        name = resource.name
        err = grpc_topic_error(name, self.system_topics)
        if err:
            raise RequestError(Code.ILLEGAL_TOPIC, err)
        return self.store.topics.get(name)

    def _topic(self, resource: Any) -> Any:
        cfg = self._known_topic(resource)
        name = resource.name
        if cfg is None:
            raise RequestError(  # the MQClientException the proxy caught, as it words it
                Code.TOPIC_NOT_FOUND,
                f"CODE: 17  DESC: No topic route info in name server for the topic: {name}"
                "\nFor more information, please visit the url, "
                "https://rocketmq.apache.org/docs/bestPractice/06FAQ",
            )
        return cfg

    def _group(self, resource: Any) -> Any:
        name = resource.name
        err = grpc_group_error(name)
        if err:
            raise RequestError(Code.ILLEGAL_CONSUMER_GROUP, err)
        cfg = self.store.groups.find_or_create(name)
        if cfg is None:
            raise RequestError(Code.CONSUMER_GROUP_NOT_FOUND, f"consumer group not found: {name}")
        return cfg

    def _broker(self, endpoints: Any) -> Any:
        addresses = list(endpoints.addresses) if endpoints is not None else []
        if not addresses:
            addresses = [pb.Address(host=self.endpoint[0], port=self.endpoint[1])]
        return pb.Broker(
            name=self.broker.config.brokerName,
            id=0,
            endpoints=pb.Endpoints(scheme=endpoints.scheme or pb.IPv4, addresses=addresses),
        )

    @staticmethod
    def _permission(perm: int) -> int:
        r, w = bool(perm & Perm.READ), bool(perm & Perm.WRITE)
        return pb.READ_WRITE if r and w else pb.READ if r else pb.WRITE if w else pb.NONE

    def _accepts(self, cfg: Any) -> list[int]:
        kind = cfg.message_type
        if kind == "MIXED":
            return [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION]
        return [getattr(pb, kind, pb.MESSAGE_TYPE_UNSPECIFIED)]

    # --- route ------------------------------------------------------------------------
    async def query_route(self, request: Any, context: Any) -> Any:
        """Every broker's queues of the topic (``cluster.py``); the accepted message types
        are this broker's topic's, UNSPECIFIED where it has no such topic (the proxy in
        local mode reads its own broker's config)."""
        try:
            self._client(context)
            cfg = self._known_topic(request.topic)
            brokers = await self.cluster.queues(request.topic.name)
            if not brokers:
                self._topic(request.topic)  # TOPIC_NOT_FOUND, as the proxy words it
        except RequestError as exc:
            return pb.QueryRouteResponse(status=status(exc.code, exc.message))
        here = self._broker(request.endpoints)
        accepts = self._accepts(cfg) if cfg is not None else [pb.MESSAGE_TYPE_UNSPECIFIED]
        queues = [q for bq in brokers for q in bq.message_queues(request.topic, here, accepts)]
        return pb.QueryRouteResponse(status=status(Code.OK), message_queues=queues)

    async def query_assignment(self, request: Any, context: Any) -> Any:
        """One assignment per readable master (per queue for a FIFO group), each at its
        own broker: a consumer receives from every broker of the cluster."""
        try:
            self._client(context)
            self._known_topic(request.topic)
            brokers = await self.cluster.queues(request.topic.name)
            if not brokers:
                self._topic(request.topic)
            gcfg = self._group(request.group)
        except RequestError as exc:
            return pb.QueryAssignmentResponse(status=status(exc.code, exc.message))
        here = self._broker(request.endpoints)
        assignments: list[Any] = []
        for bq in brokers:
            if not bq.readable_master:
                continue
            broker = bq.broker(here)
            permission = self._permission(bq.perm)
            ids = range(bq.read_queues) if gcfg.consumeMessageOrderly else [-1]
            assignments.extend(
                pb.Assignment(
                    message_queue=pb.MessageQueue(
                        topic=request.topic, id=i, permission=permission, broker=broker
                    )
                )
                for i in ids
            )
        if not assignments:
            return pb.QueryAssignmentResponse(status=status(Code.FORBIDDEN, "no readable queue"))
        return pb.QueryAssignmentResponse(status=status(Code.OK), assignments=assignments)

    # --- clients ----------------------------------------------------------------------
    def _registered(self, client: ClientState, request: Any) -> None:
        """ClientActivity: a heartbeat or termination is read against the settings the
        client sent on Telemetry; none yet, or a type that is neither producer nor
        consumer, is 40015; a consumer's group must be a legal one."""
        settings = client.settings
        if settings is None:
            raise RequestError(
                Code.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client"
            )
        kind = settings.client_type
        if kind in (pb.PUSH_CONSUMER, pb.SIMPLE_CONSUMER):
            err = grpc_group_error(request.group.name)
            if err:
                raise RequestError(Code.ILLEGAL_CONSUMER_GROUP, err)
        elif kind != pb.PRODUCER:  # Java's enum name; a number it does not know: UNRECOGNIZED
            known = kind in pb.ClientType.values()
            raise RequestError(
                Code.UNRECOGNIZED_CLIENT_TYPE, pb.ClientType.Name(kind) if known else "UNRECOGNIZED"
            )

    async def heartbeat(self, request: Any, context: Any) -> Any:
        try:
            client = self._client(context)
            self._registered(client, request)
        except RequestError as exc:
            return pb.HeartbeatResponse(status=status(exc.code, exc.message))
        if request.group.name:
            client.group = request.group.name
        client.kind = request.client_type or client.kind
        return pb.HeartbeatResponse(status=status(Code.OK))

    async def notify_termination(self, request: Any, context: Any) -> Any:
        try:
            client = self._client(context)
            self._registered(client, request)
        except RequestError as exc:
            return pb.NotifyClientTerminationResponse(status=status(exc.code, exc.message))
        self.forget(client.client_id)
        return pb.NotifyClientTerminationResponse(status=status(Code.OK))

    def forget(self, client_id: str) -> None:
        self.clients.pop(client_id, None)
        self.pop.release_client(client_id)

    def alive(self, client_id: str) -> bool:
        """Connected: a Telemetry stream open, or a request within CLIENT_EXPIRY_S (the
        clients heartbeat every 10 s)."""
        client = self.clients.get(client_id)
        if client is None:
            return False
        return client.telemetry is not None or time.monotonic() - client.last_seen < CLIENT_EXPIRY_S

    def expire_clients(self) -> None:
        """Forget clients gone silent (the proxy's channel expiry)."""
        for client_id in [c for c in self.clients if not self.alive(c)]:
            self.forget(client_id)

    def merged_settings(self, client: ClientState, raw: Any) -> Any:
        """The client's settings with the server's part filled in
        (``GrpcClientSettingsManager``)."""
        settings = pb.Settings()
        settings.CopyFrom(raw)
        if settings.HasField("publishing"):
            policy = settings.backoff_policy
            policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            policy.exponential_backoff.initial.CopyFrom(_duration(10))
            policy.exponential_backoff.max.CopyFrom(_duration(1000))
            policy.exponential_backoff.multiplier = 2.0
            settings.publishing.validate_message_type = True
            settings.publishing.max_body_size = self.broker.config.maxMessageSize
        elif settings.HasField("subscription"):
            group = settings.subscription.group.name
            gcfg = self.store.groups.find_or_create(group) if group else None
            sub = settings.subscription
            sub.receive_batch_size = RECEIVE_BATCH
            sub.long_polling_timeout.CopyFrom(_duration(MAX_LONG_POLL_MS))
            sub.fifo = bool(gcfg and gcfg.consumeMessageOrderly)
            retry_max = gcfg.retryMaxTimes if gcfg else 16
            settings.backoff_policy.max_attempts = retry_max + 1
            settings.backoff_policy.customized_backoff.next.extend(
                _duration(ms) for ms in RETRY_NEXT_MS
            )
        settings.metric.on = False
        return settings

    async def telemetry(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        try:
            client = self._client(context)
        except RequestError as exc:
            yield pb.TelemetryCommand(status=status(exc.code, exc.message))
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()
        client.telemetry = queue

        async def read() -> None:
            async for command in requests:
                kind = command.WhichOneof("command")
                if kind == "settings":
                    refusal = _settings_refusal(command.settings, self.system_topics)
                    if refusal is not None:
                        await queue.put(refusal)
                        return
                    client.settings = command.settings
                    if command.settings.HasField("subscription"):
                        client.group = command.settings.subscription.group.name
                    elif command.settings.HasField("publishing"):
                        client.topics = {t.name for t in command.settings.publishing.topics}
                    merged = self.merged_settings(client, command.settings)
                    await queue.put(pb.TelemetryCommand(status=status(Code.OK), settings=merged))
                # thread stack traces and verify results are answers to commands idemp
                # never sends; they are accepted and dropped
            await queue.put(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, _Abort):  # as the proxy ends the stream: onError
                    await context.abort(item.code, item.details)
                yield item
        finally:
            reader.cancel()
            if client.telemetry is queue:
                client.telemetry = None

    # --- send -------------------------------------------------------------------------
    async def send_message(self, request: Any, context: Any) -> Any:
        try:
            client = self._client(context)
            if not request.messages:
                raise RequestError(Code.MESSAGE_CORRUPTED, "no message to send")
            first_topic = request.messages[0].topic.name
            if any(m.topic.name != first_topic for m in request.messages):
                raise RequestError(Code.MESSAGE_CORRUPTED, "topic in message is not same")
            cfg = self._send_topic(request.messages[0])
            perm = cfg.perm & self.broker.config.brokerPermission
            if not perm & Perm.WRITE:
                raise RequestError(Code.FORBIDDEN, f"topic {cfg.topicName} is not writable")
            entries = []
            queue_id = self._select_queue(cfg, request)
            peer = _peer(context)
            ends = []
            checked = not _retry_or_dlq(cfg.topicName)
            validated = [
                self._validated(m, cfg, queue_id, peer, checked and i == 0)
                for i, m in enumerate(request.messages)
            ]
            refusal = self.store.write_refusal()
            if refusal is not None:  # the broker's remark, wrapped by the proxy
                raise RequestError(Code.INTERNAL_SERVER_ERROR, _PROXY + refusal)
            if _store_refuses(validated):
                illegal = illegal_text(self.broker.config.maxMessageSize)
                raise RequestError(Code.INTERNAL_SERVER_ERROR, _PROXY + illegal)
            for message, stored in zip(request.messages, validated):
                entry, end = self._put(stored, message)
                entries.append(entry)
                ends.append(end)
        except RequestError as exc:
            return pb.SendMessageResponse(status=status(exc.code, exc.message))
        del client
        if self.broker.config.sync_flush and ends:
            if not await self.store.wait_flushed(max(ends)):
                flush_timeout = status(Code.MASTER_PERSISTENCE_TIMEOUT, "flush disk timeout")
                for entry in entries:
                    entry.status.CopyFrom(flush_timeout)
                return pb.SendMessageResponse(status=flush_timeout, entries=entries)
        return pb.SendMessageResponse(status=status(Code.OK), entries=entries)

    def _send_topic(self, message: Any) -> Any:
        """The proxy checks the message type against the topic's before it looks the
        topic up, so an unknown topic fails that check (its type is UNSPECIFIED); a retry
        or DLQ topic's type is not checked, and its look-up fails instead."""
        name = message.topic.name
        missing = (
            bool(name)
            and not grpc_topic_error(name, self.system_topics)
            and self.store.topics.get(name) is None
        )
        if missing and _retry_or_dlq(name):
            raise RequestError(Code.INTERNAL_SERVER_ERROR, _NO_TOPIC_CONFIG)
        if missing:
            got = message_type_of(to_stored(message, 0, ("", 0), name).properties)
            conflict = _type_conflict("UNSPECIFIED", got)
            raise RequestError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, conflict)
        return self._topic(message.topic)

    def _select_queue(self, cfg: Any, request: Any) -> int:
        writable = max(cfg.writeQueueNums, 1)
        group = ""
        if len(request.messages) == 1:
            group = request.messages[0].system_properties.message_group
        if group:
            return consistent_hash(java_string_hash(group), writable)
        self._rr += 1
        return self._rr % writable

    def _validated(
        self, message: Any, cfg: Any, queue_id: int, peer: tuple[str, int], type_checked: bool
    ) -> Any:
        sysp = message.system_properties
        limit = self.broker.config.maxMessageSize
        if not message.body:  # the proxy's enableMessageBodyEmptyCheck, on by default
            raise RequestError(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
        if len(message.body) > limit:
            raise RequestError(
                Code.MESSAGE_BODY_TOO_LARGE, f"message body cannot exceed the max {limit}"
            )
        props = message.user_properties
        if len(props) > USER_PROPERTY_MAX_NUM:
            raise RequestError(
                Code.MESSAGE_PROPERTIES_TOO_LARGE,
                f"too many user properties, max is {USER_PROPERTY_MAX_NUM}",
            )
        size = 0
        for key, value in props.items():
            if key in SYSTEM_KEYS:
                raise RequestError(
                    Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {key}"
                )
            if _has_control(key):
                raise RequestError(
                    Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                    "the key of property cannot contain control character",
                )
            if _has_control(value):
                raise RequestError(
                    Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                    "the value of property cannot contain control character",
                )
            size += len(key.encode()) + len(value.encode())
        tag = sysp.tag
        _check_text(tag, Code.ILLEGAL_MESSAGE_TAG, "tag", bar=True)
        size += len(tag.encode())
        for key in sysp.keys:
            _check_text(key, Code.ILLEGAL_MESSAGE_KEY, "key")
            size += len(key.encode())
        if size > USER_PROPERTY_MAX_SIZE:
            raise RequestError(
                Code.MESSAGE_PROPERTIES_TOO_LARGE,
                f"the total size of user property is too large, max is {USER_PROPERTY_MAX_SIZE}",
            )
        if not sysp.message_id.strip():
            raise RequestError(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
        if sysp.HasField("orphaned_transaction_recovery_duration"):
            seconds = sysp.orphaned_transaction_recovery_duration.seconds
            if sysp.message_type == pb.TRANSACTION and seconds > MAX_RECOVERY_S:
                raise RequestError(
                    Code.BAD_REQUEST,
                    "the max transaction recovery time of message is too large, max is "
                    f"{MAX_RECOVERY_S}",
                )
        if sysp.HasField("delivery_timestamp"):
            _check_timestamp(sysp.delivery_timestamp)
            deliver = _ms(sysp.delivery_timestamp)
            if deliver - int(time.time() * 1000) > MAX_DELAY_MS:
                raise RequestError(
                    Code.ILLEGAL_DELIVERY_TIME,
                    f"the max delay time of message is too large, max is {MAX_DELAY_MS}",
                )
        group = sysp.message_group
        if group:
            if not group.strip():
                raise RequestError(
                    Code.ILLEGAL_MESSAGE_GROUP,
                    "message group cannot be the char sequence of whitespace",
                )
            if len(group.encode()) >= MESSAGE_GROUP_MAX:
                raise RequestError(
                    Code.ILLEGAL_MESSAGE_GROUP,
                    f"message group exceed the max size {MESSAGE_GROUP_MAX}",
                )
            if _has_control(group):
                raise RequestError(
                    Code.ILLEGAL_MESSAGE_GROUP, "message group cannot contain control character"
                )
        stored = to_stored(message, queue_id, peer, cfg.topicName)
        kind = cfg.message_type
        got = message_type_of(stored.properties)
        # ProducerProcessor checks the first message alone, and no retry or DLQ topic's
        if not type_checked:
            return stored
        if kind != "MIXED" and got != kind:
            conflict = _type_conflict(kind, got)
            raise RequestError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, conflict)
        return stored

    def _put(self, stored: Any, message: Any) -> tuple[Any, int]:
        msg_id = message.system_properties.message_id
        config = self.broker.config
        stored.properties[Prop.CLUSTER] = config.brokerClusterName
        # RocketMQ 5.3.3 stores the broker's region and trace switch with every message
        # (AbstractSendMessageProcessor; measured: a 4.x pull sees them), 4.9.7 does not
        stored.properties[Prop.MSG_REGION] = config.regionId
        stored.properties[Prop.TRACE_ON] = "true" if config.traceOn else "false"
        keep_wait = False
        if stored.properties.get(Prop.TRAN_MSG) == "true":
            stored.properties[Prop.REAL_TOPIC] = stored.topic
            stored.properties[Prop.REAL_QID] = str(stored.queue_id)
            stored.sys_flag &= ~MessageSysFlag.TRANSACTION_MASK
            stored.topic, stored.queue_id = TRANS_HALF_TOPIC, 0
            keep_wait = True
        try:
            # a delivery time still to come parks it in the timer topic (the store does)
            result = self.store.put(stored, keep_wait=keep_wait, timer=True)
        except MessageFormatError as exc:
            raise RequestError(Code.MESSAGE_CORRUPTED, str(exc)) from None
        if keep_wait:
            self._remember_tx(stored.properties[Prop.REAL_TOPIC], msg_id, result.commit_log_offset)
        recall_handle = ""
        if stored.topic == TIMER_TOPIC:  # parked until its delivery time: recallable
            recall_handle = build_handle(
                stored.properties[Prop.REAL_TOPIC],
                self.broker.config.brokerName,
                int(stored.properties[TIMER_DELIVER_MS]),
                msg_id,
            )
        entry = pb.SendResultEntry(
            status=status(Code.OK),
            message_id=msg_id,
            transaction_id=msg_id,  # the broker's answer to every send: the message's id
            offset=result.queue_offset,
            recall_handle=recall_handle,
        )
        return entry, result.end

    async def recall_message(self, request: Any, context: Any) -> Any:
        """ProducerProcessor.recallMessage, then the broker's RecallMessageProcessor:
        the topic's name and type (DELAY or MIXED), the handle's form, then (only with
        ``recallMessageEnable``) its topic, broker and time; a recall that passes parks a
        marker that the timer matches when the message comes due."""
        try:
            self._client(context)
            name = request.topic.name
            err = grpc_topic_error(name, self.system_topics)
            if err:
                raise RequestError(Code.ILLEGAL_TOPIC, err)
            cfg = self.store.topics.get(name)
            kind = cfg.message_type if cfg is not None else "UNSPECIFIED"
            if kind not in ("DELAY", "MIXED"):
                conflict = _type_conflict(kind, "DELAY")
                raise RequestError(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, conflict)
            handle = parse_handle(request.recall_handle)
            if handle is None:
                raise RequestError(Code.INTERNAL_SERVER_ERROR, _PROXY + "recall handle is invalid")
            if not self.broker.config.recallMessageEnable:
                forbidden = _PROXY + "recall failed, operation is forbidden"
                raise RequestError(Code.INTERNAL_SERVER_ERROR, forbidden)
            now = int(time.time() * 1000)
            why = refusal(handle, name, self.broker.config.brokerName, now)
            if why:
                raise RequestError(Code.INTERNAL_SERVER_ERROR, _PROXY + why)
            marker = MessageExt(
                topic=name,
                body=b"0",
                properties={
                    Prop.TAGS: RECALL_TAG,
                    Prop.TIMER_DEL_UNIQKEY: delete_key(name, handle.message_id),
                    Prop.UNIQ_KEY: handle.message_id,
                    TIMER_DELIVER_MS: str(int(handle.timestamp)),  # a Java long: checked
                },
                born_timestamp=now,
                born_host=_peer(context),
            )
            try:
                result = self.store.put(marker, timer=True)
            except MessageFormatError as exc:
                raise RequestError(Code.INTERNAL_SERVER_ERROR, _PROXY + str(exc)) from None
        except RequestError as exc:
            return pb.RecallMessageResponse(status=status(exc.code, exc.message))
        if self.broker.config.sync_flush:
            await self.store.wait_flushed(result.end)
        return pb.RecallMessageResponse(status=status(Code.OK), message_id=handle.message_id)

    async def end_transaction(self, request: Any, context: Any) -> Any:
        try:
            self._client(context)
            cfg = self._topic(request.topic)
            if not request.transaction_id:
                raise RequestError(Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
            # the proxy keeps what it sent as half messages (and asked to check) for 30 s,
            # and an EndTransaction takes it: a second one finds nothing
            phy = self._take_tx(cfg.topicName, request.transaction_id)
            half = self.store.lookup(phy) if phy is not None else None
            if half is None:
                raise RequestError(Code.INTERNAL_SERVER_ERROR, NO_TRANSACTION_DATA)
            resolution = request.resolution
            if resolution not in (pb.COMMIT, pb.ROLLBACK):
                return pb.EndTransactionResponse(status=status(Code.OK))
            error = self.broker.transactions.end(
                cfg.topicName, half.queue_offset, phy, commit=resolution == pb.COMMIT
            )
            if error and error != STORE_REFUSED:  # the proxy sends a commit one way
                raise RequestError(Code.INTERNAL_SERVER_ERROR, error)
        except RequestError as exc:
            return pb.EndTransactionResponse(status=status(exc.code, exc.message))
        return pb.EndTransactionResponse(status=status(Code.OK))

    # --- receive ----------------------------------------------------------------------
    async def receive_message(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            async for response in self._receive(request, context):
                yield response
        except Exception as exc:
            log.exception("v5: ReceiveMessage failed")
            problem = status(Code.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
            yield pb.ReceiveMessageResponse(status=problem)
        # the proxy's writer ends every receive, found or not, with the time it answered
        # (the 5.x clients take it for their receive-latency metric)
        now = int(time.time() * 1000)
        yield pb.ReceiveMessageResponse(delivery_timestamp=timestamp(now))

    async def _receive(self, request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            client = self._client(context)
            settings = client.settings
            remaining = context.time_remaining()
            remaining_ms = int(remaining * 1000) if remaining is not None else MAX_LONG_POLL_MS * 2
            if request.HasField("long_polling_timeout"):
                polling = _ms(request.long_polling_timeout)
            else:
                timeout = _ms(settings.request_timeout) if settings is not None else 3000
                polling = remaining_ms - timeout // 2
            polling = max(MIN_LONG_POLL_MS, min(polling, MAX_LONG_POLL_MS))
            if polling > remaining_ms:
                if remaining_ms < MIN_LONG_POLL_MS:
                    raise RequestError(
                        Code.ILLEGAL_POLLING_TIME,
                        "The deadline time remaining is not enough for polling, "
                        "please check network condition",
                    )
                polling = remaining_ms
            known = self._known_topic(request.message_queue.topic)
            gcfg = self._group(request.group)
            invisible = _ms(request.invisible_duration)
            if request.auto_renew:
                invisible = 60_000  # defaultInvisibleTimeMills; the proxy renews it
            elif invisible < self.broker.config.minInvisibleTimeMillsForRecv:
                minimum = self.broker.config.minInvisibleTimeMillsForRecv
                raise RequestError(
                    Code.ILLEGAL_INVISIBLE_TIME,
                    f"the invisibleTime is too small. min is {minimum}",
                )
            elif invisible > MAX_INVISIBLE_MS:
                raise RequestError(
                    Code.ILLEGAL_INVISIBLE_TIME,
                    f"the invisibleTime is too large. max is {MAX_INVISIBLE_MS}",
                )
            accepts = _filter(request.filter_expression)
            if known is None:  # the pop's route look-up
                raise RequestError(Code.INTERNAL_SERVER_ERROR, _NO_TOPIC_CONFIG)
            cfg = known
            if not gcfg.consumeEnable:  # PopMessageProcessor: NO_PERMISSION, through the proxy
                raise RequestError(
                    Code.INTERNAL_SERVER_ERROR,
                    f"{_PROXY}subscription group no permission, {gcfg.groupName}",
                )
            if request.batch_size < 0:  # the pop's message list, sized by it
                raise RequestError(
                    Code.INTERNAL_SERVER_ERROR,
                    f"Illegal Capacity: {request.batch_size}. IllegalArgumentException. "
                    "java.base/java.util.ArrayList.<init>(ArrayList.java:160)",
                )
            max_attempts = (
                settings.backoff_policy.max_attempts
                if settings is not None and settings.backoff_policy.max_attempts > 0
                else gcfg.retryMaxTimes + 1
            )
            fifo = gcfg.consumeMessageOrderly
            # the proxy caps a pop at ProxyUtils.MAX_MSG_NUMS_FOR_POP_REQUEST (32)
            batch = (
                min(request.batch_size, RECEIVE_BATCH) if request.batch_size > 0 else RECEIVE_BATCH
            )
        except RequestError as exc:
            yield pb.ReceiveMessageResponse(status=status(exc.code, exc.message))
            return
        topic = cfg.topicName
        deadline = time.monotonic() + polling / 1000
        while True:
            popped = self.pop.pop(
                gcfg.groupName,
                topic,
                batch,
                invisible,
                fifo=fifo,
                accepts=accepts,
                max_attempts=max_attempts,
                renew_for=client.client_id if request.auto_renew else None,
            )
            if popped:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                yield pb.ReceiveMessageResponse(
                    status=status(Code.MESSAGE_NOT_FOUND, "no new message")
                )
                return
            # held until woken or the poll time ends, as PopLongPollingService holds it
            await self.pop.wait(topic, left)
        sent = 0
        try:
            yield pb.ReceiveMessageResponse(status=status(Code.OK))
            for item in popped:
                response = pb.ReceiveMessageResponse()
                to_proto(item.message, item.receipt.encode(), item.attempt, response.message)
                yield response
                sent += 1
        except BaseException:
            # the call ended under us (the client went away): what it never got is
            # visible again at once instead of after its invisible time
            self.pop.release(gcfg.groupName, topic, [p.receipt for p in popped[sent:]])
            raise

    async def ack_message(self, request: Any, context: Any) -> Any:
        try:
            self._client(context)
            # The proxy does not look the topic up: the broker's ack finds none
            # (TOPIC_NOT_EXIST), which the proxy words as an abnormal status. A 5.x client
            # acks so a message of a 4.x client's namespaced topic (``ns%T``, received
            # as namespace ns, topic T), as on RocketMQ 5.3.3.
            cfg = self._known_topic(request.topic)
            gcfg = self._group(request.group)
        except RequestError as exc:
            return pb.AckMessageResponse(status=status(exc.code, exc.message))
        results = []
        for entry in request.entries:
            try:
                if cfg is None:
                    self.pop.check_handle(entry.receipt_handle)
                    st = status(Code.INTERNAL_SERVER_ERROR, "ack failed: status is abnormal")
                else:
                    self.pop.ack(gcfg.groupName, cfg.topicName, entry.receipt_handle)
                    st = status(Code.OK)
            except HandleError as exc:
                st = status(_handle_code(exc), str(exc))
            except OffsetOutside:
                st = status(Code.INTERNAL_SERVER_ERROR, "ack failed: status is abnormal")
            results.append(
                pb.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st
                )
            )
        # the proxy's setAckResponseStatus: one code for all entries, or MULTIPLE_RESULTS
        codes = {r.status.code for r in results}
        if len(codes) > 1:
            overall = status(Code.MULTIPLE_RESULTS)
        elif codes:
            overall = status(codes.pop())
        else:
            overall = status(Code.INTERNAL_SERVER_ERROR, "ack message result is empty")
        return pb.AckMessageResponse(status=overall, entries=results)

    async def change_invisible(self, request: Any, context: Any) -> Any:
        try:
            self._client(context)
            cfg = self._known_topic(request.topic)  # looked up by the broker, as an ack's
            gcfg = self._group(request.group)
            invisible = _ms(request.invisible_duration)
            if invisible < 0:
                raise RequestError(
                    Code.ILLEGAL_INVISIBLE_TIME, "the invisibleTime is too small. min is 0"
                )
            if invisible > MAX_INVISIBLE_MS:
                raise RequestError(
                    Code.ILLEGAL_INVISIBLE_TIME,
                    f"the invisibleTime is too large. max is {MAX_INVISIBLE_MS}",
                )
            try:
                if cfg is None:
                    self.pop.check_handle(request.receipt_handle)
                    raise RequestError(
                        Code.INTERNAL_SERVER_ERROR,
                        "changeInvisibleDuration failed: status is abnormal",
                    )
                fresh = self.pop.change_invisible(
                    gcfg.groupName, cfg.topicName, request.receipt_handle, invisible
                )
            except HandleError as exc:
                raise RequestError(_handle_code(exc), str(exc)) from None
            except OffsetOutside:
                raise RequestError(
                    Code.INTERNAL_SERVER_ERROR, "changeInvisibleDuration failed: status is abnormal"
                ) from None
        except RequestError as exc:
            return pb.ChangeInvisibleDurationResponse(status=status(exc.code, exc.message))
        return pb.ChangeInvisibleDurationResponse(
            status=status(Code.OK), receipt_handle=fresh.encode()
        )

    async def forward_to_dlq(self, request: Any, context: Any) -> Any:
        """The proxy checks the names' syntax only and sends the handle's message back
        (delay level -1: the group's DLQ), then acks it under the names given; an ack
        that finds nothing, for a topic the broker lacks, is not reported (5.3.3)."""
        try:
            self._client(context)
            self._known_topic(request.topic)
            gcfg = self._group(request.group)
            try:
                self.pop.forward_to_dlq(gcfg.groupName, request.topic.name, request.receipt_handle)
            except HandleError as exc:
                raise RequestError(_handle_code(exc), str(exc)) from None
            except DiskFull:  # the broker's send-back answer: the put's status by name
                raise RequestError(Code.INTERNAL_SERVER_ERROR, "SERVICE_NOT_AVAILABLE") from None
        except RequestError as exc:
            return pb.ForwardMessageToDeadLetterQueueResponse(status=status(exc.code, exc.message))
        # ResponseBuilder.buildStatus: the send-back's remark, else its remoting code (0)
        return pb.ForwardMessageToDeadLetterQueueResponse(status=status(Code.OK, "0"))


def _guarded(fn: Any, response: Any) -> Any:
    """A bug must not break the call: the proxy answers an unexpected exception with
    INTERNAL_SERVER_ERROR in the response's status (ResponseBuilder.buildStatus)."""

    async def call(request: Any, context: Any) -> Any:
        try:
            return await fn(request, context)
        except Exception as exc:
            log.exception("v5: %s failed", fn.__name__)
            return response(
                status=status(Code.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
            )

    return call


def _handle_code(exc: HandleError) -> int:
    if isinstance(exc, MalformedHandle):
        return int(Code.INTERNAL_SERVER_ERROR)
    return int(Code.INVALID_RECEIPT_HANDLE)


def _peer(context: Any) -> tuple[str, int]:
    peer = context.peer() or ""
    # "ipv4:127.0.0.1:5555" or "ipv6:[::1]:5555"
    _, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    try:
        return host.strip("[]") or "127.0.0.1", int(port)
    except ValueError:
        return "127.0.0.1", 0


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text)


def _type_conflict(expected: str, actual: str) -> str:
    """The proxy's wording, its exception class included (an unknown topic's type is
    UNSPECIFIED)."""
    return (
        "org.apache.rocketmq.proxy.common.ProxyException: TopicMessageType validate failed, "
        f"the expected type is {expected}, but actual type is {actual}"
    )


@dataclass
class _Abort:
    code: grpc.StatusCode
    details: str


def _retry_or_dlq(topic: str) -> bool:
    """ProducerProcessor: "Do not check retry or dlq topic" (its message type)."""
    return topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))


def _check_timestamp(stamp: Any) -> None:
    low, high = _TIMESTAMP_SECONDS
    if not (low <= stamp.seconds <= high and 0 <= stamp.nanos <= 999_999_999):
        raise RequestError(
            Code.INTERNAL_SERVER_ERROR,
            "Timestamp is not valid. See proto definition for valid values. "
            f"Seconds ({stamp.seconds}) must be in range [-62,135,596,800, +253,402,300,799]. "
            f"Nanos ({stamp.nanos}) must be in range [0, +999,999,999].. "
            "IllegalArgumentException. "
            "com.google.protobuf.util.Timestamps.checkValid(Unknown Source)",
        )


def _store_refuses(messages: list[MessageExt]) -> bool:
    """The broker's MESSAGE_ILLEGAL: INNER_NUM without the inner-batch flag
    (HookUtils.checkInnerBatch), or a batch of transactional messages (the proxy sends
    several messages as one batch; CommitLog.asyncPutMessages refuses those)."""
    if any(Prop.INNER_NUM in m.properties for m in messages):
        return True
    return len(messages) > 1 and any(m.properties.get(Prop.TRAN_MSG) == "true" for m in messages)


def _settings_refusal(settings: Any, system_topics: Container[str]) -> _Abort | None:
    """ClientActivity.processAndWriteClientSettings: publishing topics and the
    subscription group are validated, settings with neither are refused (each refusal
    ends the Telemetry stream with INVALID_ARGUMENT); a client type Java cannot number
    fails as INTERNAL."""
    failed = "process client telemetryCommand failed. "
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    if settings.HasField("publishing"):
        for topic in settings.publishing.topics:
            err = grpc_topic_error(topic.name, system_topics)
            if err:
                return _Abort(invalid, failed + err)
    elif settings.HasField("subscription"):
        err = grpc_group_error(settings.subscription.group.name)
        if err:
            return _Abort(invalid, failed + err)
        kind = settings.client_type
        if kind not in (pb.SIMPLE_CONSUMER, pb.PUSH_CONSUMER):  # buildConsumeType
            name = pb.ClientType.Name(kind) if kind in pb.ClientType.values() else "UNRECOGNIZED"
            return _Abort(
                grpc.StatusCode.INTERNAL, f"{failed}Client type is not consumer, type: {name}"
            )
    else:
        return _Abort(invalid, "there is no publishing or subscription data in settings")
    if settings.client_type not in pb.ClientType.values():
        return _Abort(
            grpc.StatusCode.INTERNAL, failed + "Can't get the number of an unknown enum value."
        )
    return None


def _check_text(text: str, code: int, what: str, *, bar: bool = False) -> None:
    """GrpcValidator.validateTag / validateMessageKey: empty is allowed; whitespace only,
    a '|' (tags) or a control character is not."""
    if not text:
        return
    if not text.strip():
        raise RequestError(code, f"{what} cannot be the char sequence of whitespace")
    if bar and "|" in text:
        raise RequestError(code, f"{what} cannot contain '|'")
    if _has_control(text):
        raise RequestError(code, f"{what} cannot contain control character")


def _filter(expression: Any) -> Any:
    """A TAG or SQL92 expression as a predicate over stored messages. RocketMQ 5.3.3's
    POP serves SQL92 whatever enablePropertyFilter says (only 4.x pulls check it)."""
    if expression.type == pb.SQL:
        if not expression.expression:  # the proxy's FilterAPI.build
            raise RequestError(Code.ILLEGAL_FILTER_EXPRESSION, "Expression can't be null! SQL92")
        try:
            selector = compile_selector(expression.expression)
        except SelectorError as exc:
            # the broker's SUBSCRIPTION_PARSE_FAILED, which the proxy passes on as 50001 in
            # these words only; what is wrong with it goes to the log, once per expression
            if expression.expression not in _UNPARSED and len(_UNPARSED) < 1000:
                _UNPARSED.add(expression.expression)
                log.warning("v5: SQL92 filter %r does not compile: %s", expression.expression, exc)
            raise RequestError(
                Code.INTERNAL_SERVER_ERROR, _PROXY + "parse the consumer's subscription failed"
            ) from None
        return lambda msg: selector.matches(msg.properties)
    # the proxy's FilterAPI.build, as a 4.x pull's expression: " " or "|| ||" name no tag,
    # and match nothing; the broker then compares tag hash codes, not the tags
    try:
        parsed = tag_subscription(expression.expression)
    except SubscriptionSplitError as exc:
        raise RequestError(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None
    if parsed is None:
        return lambda msg: True
    codes = parsed[1]
    seen: dict[str | None, bool] = {}  # a receive's messages share few tags: hash each once

    def accepts(msg: MessageExt) -> bool:
        tag = msg.properties.get(Prop.TAGS)
        hit = seen.get(tag)
        if hit is None:
            hit = seen[tag] = tags_code(tag) in codes
        return hit

    return accepts


__all__ = ["MessagingService", "Receipt"]
