"""Between RocketMQ 5's protobuf ``Message`` and the broker's stored ``MessageExt``.

The mapping is the proxy's (``SendMessageActivity.buildMessageProperty`` on the way in,
``GrpcConverter.buildMessage`` on the way out): system properties become the 4.x
property keys a remoting client reads, so a message sent by either kind of client is
consumed alike by both.
"""

from __future__ import annotations

import hashlib
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from idemp.remoting.codes import MessageSysFlag, Prop, split_namespace
from idemp.remoting.message import MessageExt

from .schema import pb

TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TRACE_CONTEXT = "TRACE_CONTEXT"
BORN_HOST = "__BORNHOST"
BORN_TIMESTAMP = "BORN_TIMESTAMP"
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"

# MessageConst.STRING_HASH_SET of RocketMQ 5.3.3: keys a user property may not use, and
# that are not handed back as user properties (__SHARDINGKEY and TRACE_CONTEXT are not
# in it: RocketMQ returns them among the user properties too, and so does idemp).
SYSTEM_KEYS = frozenset(
    {
        "1ST_POP_TIME", "ARRIVE_TIME", "BORN_TIMESTAMP", "BUYER_ID", "CLUSTER",
        "CONSUME_START_TIME", "CORRECTION_FLAG", "CORRELATION_ID", "DELAY",
        "DLQ_ORIGIN_MESSAGE_ID", "DLQ_ORIGIN_TOPIC", "DUP_INFO", "EXTEND_UNIQ_INFO",
        "INNER_MULTI_QUEUE_OFFSET", "INSTANCE_ID", "KEYS", "MAX_OFFSET",
        "MAX_RECONSUME_TIMES", "MIN_OFFSET", "MQ2_FLAG", "MSG_REGION", "MSG_TYPE",
        "ORIGIN_MESSAGE_ID", "PGROUP", "POP_CK", "POP_CK_OFFSET", "PUSH_REPLY_TIME",
        "REAL_QID", "REAL_TOPIC", "RECONSUME_TIME", "REPLY_TO_CLIENT", "RETRY_TOPIC", "TAGS",
        "TIMER_DELAY_LEVEL", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS",
        "TIMER_DEL_UNIQKEY", "TIMER_DEQUEUE_MS", "TIMER_ENQUEUE_MS", "TIMER_OUT_MS",
        "TIMER_ROLL_TIMES", "TRACE_ON", "TRANSFER_FLAG", "TRAN_MSG",
        "TRAN_PREPARED_QUEUE_OFFSET", "TTL", "UNIQ_KEY", "WAIT", "__BORNHOST", "__CRC32#",
    }
)  # fmt: skip


def message_type_of(props: dict[str, str]) -> str:
    """``TopicMessageType.parseFromMessageProperty``: what a message is, by its properties."""
    if props.get(Prop.TRAN_MSG) == "true":
        return "TRANSACTION"
    if Prop.DELAY in props or TIMER_DELIVER_MS in props or TIMER_DELAY_SEC in props:
        return "DELAY"
    if Prop.SHARDING_KEY in props:
        return "FIFO"
    return "NORMAL"


def _millis(ts: Any) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def timestamp(ms: int) -> Any:
    return _set_millis(Timestamp(), ms)


def to_stored(
    message: Any, queue_id: int, peer: tuple[str, int], producer_group: str
) -> MessageExt:
    """A validated protobuf message as the broker stores it (validation is the caller's)."""
    sysp = message.system_properties
    props: dict[str, str] = dict(message.user_properties)
    if sysp.HasField("tag"):
        props[Prop.TAGS] = sysp.tag
    if sysp.keys:
        props[Prop.KEYS] = " ".join(sysp.keys)
    props[Prop.UNIQ_KEY] = sysp.message_id
    sys_flag = 0
    if sysp.body_encoding == pb.GZIP:
        sys_flag |= MessageSysFlag.COMPRESSED
    if sysp.message_type == pb.TRANSACTION:
        props[Prop.TRAN_MSG] = "true"
        # RocketMQ 5.3.3's broker names the transaction in the half message
        # (TransactionalMessageBridge.parseHalfMessageInner; 4.9.7's does not)
        props[Prop.TRANSACTION_ID] = sysp.message_id
        sys_flag |= MessageSysFlag.TRANSACTION_PREPARED
        if sysp.HasField("orphaned_transaction_recovery_duration"):
            props[CHECK_IMMUNITY] = str(sysp.orphaned_transaction_recovery_duration.seconds)
    if sysp.HasField("delivery_timestamp"):
        props[TIMER_DELIVER_MS] = str(_millis(sysp.delivery_timestamp))
    props[Prop.RECONSUME_TIME] = str(sysp.delivery_attempt)
    props[Prop.PGROUP] = producer_group
    if sysp.HasField("message_group") and sysp.message_group:
        props[Prop.SHARDING_KEY] = sysp.message_group
    if sysp.HasField("trace_context") and sysp.trace_context:
        props[TRACE_CONTEXT] = sysp.trace_context
    props[BORN_HOST] = sysp.born_host or f"{peer[0]}:{peer[1]}"
    born = _millis(sysp.born_timestamp) if sysp.HasField("born_timestamp") else 0
    if born:
        props[BORN_TIMESTAMP] = str(born)
    return MessageExt(
        topic=message.topic.name,
        body=bytes(message.body),
        properties=props,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=born,
        born_host=peer,
    )


def to_proto(msg: MessageExt, receipt: str | None, attempt: int, into: Any = None) -> Any:
    """The message as a 5.x client receives it, written into ``into`` (a response's
    ``message`` field) when given: filled in place, nothing is built and then copied
    (the copies were half of a receive's conversion cost). Its topic's namespace is the
    stored name's (a 4.x client's ``ns%Topic``), not the receiving client's, as RocketMQ
    5.3.3's GrpcConverter.buildMessage makes it."""
    out = pb.Message() if into is None else into
    props = msg.properties
    out.topic.resource_namespace, out.topic.name = split_namespace(msg.topic)
    sysp = out.system_properties
    sysp.message_id = props.get(Prop.UNIQ_KEY) or msg.offset_msg_id
    sysp.body_digest.type = pb.MD5
    sysp.body_digest.checksum = hashlib.md5(msg.body).hexdigest().upper()
    sysp.body_encoding = pb.GZIP if msg.sys_flag & MessageSysFlag.COMPRESSED else pb.IDENTITY
    sysp.message_type = getattr(pb, message_type_of(props))
    _set_millis(sysp.born_timestamp, msg.born_timestamp)
    # no __BORNHOST (a 4.x producer's message): the born address without its port, as
    # GrpcConverter.buildSystemProperties takes getBornHostString()
    sysp.born_host = props.get(BORN_HOST) or msg.born_host[0]
    _set_millis(sysp.store_timestamp, msg.store_timestamp)
    sysp.store_host = f"{msg.store_host[0]}:{msg.store_host[1]}"
    sysp.queue_id = msg.queue_id
    sysp.queue_offset = msg.queue_offset
    sysp.delivery_attempt = attempt
    if Prop.TAGS in props:
        sysp.tag = props[Prop.TAGS]
    if Prop.KEYS in props:
        sysp.keys.extend(props[Prop.KEYS].split(" "))
    if TIMER_DELIVER_MS in props:
        _set_millis(sysp.delivery_timestamp, int(props[TIMER_DELIVER_MS]))
    if Prop.SHARDING_KEY in props:
        sysp.message_group = props[Prop.SHARDING_KEY]
    if receipt is not None:
        sysp.receipt_handle = receipt
    if TRACE_CONTEXT in props:
        sysp.trace_context = props[TRACE_CONTEXT]
    if DLQ_ORIGIN_TOPIC in props and DLQ_ORIGIN_MESSAGE_ID in props:
        sysp.dead_letter_queue.topic = props[DLQ_ORIGIN_TOPIC]
        sysp.dead_letter_queue.message_id = props[DLQ_ORIGIN_MESSAGE_ID]
    out.user_properties.update({k: v for k, v in props.items() if k not in SYSTEM_KEYS})
    out.body = msg.body
    return out


def _set_millis(ts: Any, ms: int) -> Any:
    ts.seconds = ms // 1000
    ts.nanos = (ms % 1000) * 1_000_000
    return ts
