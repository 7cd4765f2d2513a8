"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320) and
CONSUMER_SEND_MSG_BACK (36), following RocketMQ's SendMessageProcessor."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

from idemp.remoting import MessageExt, RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import (
    NOT_ALLOWED_SEND_TOPICS,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TRANS_HALF_TOPIC,
    MessageSysFlag,
    Perm,
    Prop,
    TopicSysFlag,
)
from idemp.remoting.javaparse import JavaError, java_int, parse_java_int
from idemp.remoting.message import (
    PROPERTY_SEPARATOR,
    MessageFormatError,
    decode_properties,
    encode_stored_properties,
)
from idemp.remoting.msgid import offset_msg_id

from .batchread import MalformedEntry, read_batch
from .brokerstats import (
    BROKER_PUT_NUMS,
    QUEUE_PUT_NUMS,
    QUEUE_PUT_SIZE,
    SNDBCK_PUT_NUMS,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
)
from .metadata import TopicConfig, dlq_topic, retry_topic, topic_error

if TYPE_CHECKING:
    from .context import Broker, Handler, HandlerResult, Peer
    from .store import MessageStore, PutResult

FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
V3_4_9 = 121
MAX_PROPERTIES = 32767

# SEND_MESSAGE_V2 carries the V1 header under one-letter keys.
_V2_KEYS = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "bname",
}
# the header's numbers and their Java types' bits (int, or long)
_NUMBERS = {
    "defaultTopicQueueNums": 32,
    "queueId": 32,
    "sysFlag": 32,
    "bornTimestamp": 64,
    "flag": 32,
    "reconsumeTimes": 32,
    "maxReconsumeTimes": 32,
}
_NO_QUEUE_TO_CHOOSE = JavaError(  # randomQueueId: nextInt(99999999) % writeQueueNums
    "java.lang.ArithmeticException: / by zero, org.apache.rocketmq.broker.processor"
    ".SendMessageProcessor.randomQueueId(SendMessageProcessor.java:689)"
)
_NO_BATCH_BODY = JavaError(
    "java.lang.NullPointerException: Cannot read the array length because the return value of "
    '"org.apache.rocketmq.common.message.MessageExtBatch.getBody()" is null, '
    "org.apache.rocketmq.store.DefaultMessageStore.checkMessages(DefaultMessageStore.java:391)"
)
_BATCH_PROPERTIES_TOO_LONG = JavaError(
    "java.lang.RuntimeException: Properties size of messageExtBatch exceeded!, "
    "org.apache.rocketmq.store.CommitLog$MessageExtEncoder.encode(CommitLog.java:1624)"
)


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.SEND_MESSAGE] = send_message
    handlers[RequestCode.SEND_MESSAGE_V2] = send_message
    handlers[RequestCode.SEND_BATCH_MESSAGE] = send_message
    handlers[RequestCode.CONSUMER_SEND_MSG_BACK] = send_back


def _v1_header(cmd: RemotingCommand) -> RemotingCommand:
    """The send's header under V1 names, decoded as RocketMQ 4.9.7 decodes it. SEND_MESSAGE
    (RemotingCommand.decodeCommandCustomHeader) catches each field's error: a number
    that does not parse is left null, as a missing one. Codes 310 and 320
    (SendMessageRequestHeaderV2.decode) read the one-letter keys alone, in their order,
    and a number that does not parse throws."""
    if cmd.code == RequestCode.SEND_MESSAGE:
        ext = {
            k: v
            for k, v in cmd.ext_fields.items()
            if k not in _NUMBERS or parse_java_int(v, _NUMBERS[k]) is not None
        }
    else:
        ext = {}
        for short, name in _V2_KEYS.items():
            value = cmd.ext_fields.get(short)
            if value is None:
                continue
            if name in _NUMBERS:
                java_int(value, _NUMBERS[name])
            ext[name] = value
    return RemotingCommand(
        code=cmd.code,
        opaque=cmd.opaque,
        flag=cmd.flag,
        language=cmd.language,
        version=cmd.version,
        ext_fields=ext,
        body=cmd.body,
    )


def _java_bool(value: str | None) -> bool:
    """Java's Boolean.parseBoolean: only "true" (any case) is true. The C++ client's "1"
    for a batch is therefore *not* a batch on a real broker, and not here either."""
    return value is not None and value.strip().lower() == "true"


def _is_order(store: MessageStore, topic: str) -> bool:
    tcfg = store.topics.get(topic)
    return tcfg is not None and tcfg.order


def _msg_check(
    server: Broker, conn: Peer, request: RemotingCommand, cmd: RemotingCommand
) -> tuple[TopicConfig, int] | RemotingCommand:
    """AbstractSendMessageProcessor.msgCheck: the broker writable, the topic legal and
    present (or auto-created), the queue within it. The topic's config and the queue
    asked for (negative: any), or the refusal."""
    store = server.store
    assert store is not None
    topic = cmd.ext_fields["topic"]
    # a broker without write permission still takes sends, but to order topics: what it
    # loses is the nameserver's routes (clients stop choosing it), as RocketMQ's does
    if not server.config.brokerPermission & Perm.WRITE and _is_order(store, topic):
        return request.response(
            ResponseCode.NO_PERMISSION,
            f"the broker[{server.config.brokerIP1}] sending message is forbidden",
        )
    err = topic_error(topic)
    if err:
        return request.response(ResponseCode.SYSTEM_ERROR, err)
    if topic in NOT_ALLOWED_SEND_TOPICS:
        return request.response(
            ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden."
        )
    tcfg = store.topics.get(topic)
    if tcfg is None:
        # from the default topic first, a retry topic included (with TBW102's queues, as
        # the producer's route for it had them); a retry topic's own single queue after
        cmd.require("defaultTopicQueueNums", "defaultTopic")
        retry = topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        sys_flag = 0
        if _java_bool(cmd.ext_fields.get("unitMode")):
            # TopicSysFlag.buildSysFlag(unit, hasUnitSub) for the topic the send creates
            sys_flag = TopicSysFlag.UNIT_SUB if retry else TopicSysFlag.UNIT
        tcfg = store.topics.create_in_send(
            topic,
            cmd.ext_fields["defaultTopic"],
            cmd.field_int("defaultTopicQueueNums"),
            auto_create=server.config.autoCreateTopicEnable,
            sys_flag=sys_flag,
        )
        if tcfg is None and retry:
            tcfg = store.topics.create_system(topic, 1, Perm.READ | Perm.WRITE, sys_flag)
        if tcfg is None:
            return request.response(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!{FAQ}"
            )
    queue_id = cmd.field_int("queueId")
    if queue_id >= max(tcfg.readQueueNums, tcfg.writeQueueNums):
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"request queueId[{queue_id}] is illegal, {tcfg} Producer: {conn.peer}",
        )
    return tcfg, queue_id


def illegal_text(max_message_size: int) -> str:
    return (
        "the message is illegal, maybe msg body or properties length not matched. "
        f"msg body length limit {max_message_size}B, msg properties length limit 32KB."
    )


def illegal(server: Broker, request: RemotingCommand) -> RemotingCommand:
    """SendMessageProcessor's one answer for a body over maxMessageSize or properties
    over 32767 (the store's MESSAGE_ILLEGAL and PROPERTIES_SIZE_EXCEEDED alike)."""
    return request.response(
        ResponseCode.MESSAGE_ILLEGAL, illegal_text(server.config.maxMessageSize)
    )


def accept(
    server: Broker, conn: Peer, request: RemotingCommand
) -> tuple[RemotingCommand, TopicConfig, int] | RemotingCommand:
    """A send's header in V1 form, its topic's config and the queue it goes to (a random
    one when it named none), after msgCheck; or msgCheck's refusal."""
    cmd = _v1_header(request)
    if not cmd.ext_fields.get("topic") and server.config.brokerPermission & Perm.WRITE:
        # RocketMQ's header decoding leaves a missing field null, and msgCheck refuses a
        # null topic as blank before any other field is used
        return request.response(ResponseCode.SYSTEM_ERROR, topic_error("") or "")
    cmd.require("topic")
    checked = _msg_check(server, conn, request, cmd)
    if isinstance(checked, RemotingCommand):
        return checked
    tcfg, queue_id = checked
    if queue_id < 0:
        if tcfg.writeQueueNums <= 0:
            raise _NO_QUEUE_TO_CHOOSE
        queue_id = random.randrange(tcfg.writeQueueNums)
    return cmd, tcfg, queue_id


def send_message(server: Broker, conn: Peer, request: RemotingCommand) -> HandlerResult:
    """SendMessageProcessor.preSend builds its response with the broker's region and trace
    switch, and every refusal after it is that response; one from an exception is not."""
    response = _send_message(server, conn, request)
    if isinstance(response, RemotingCommand) and response.code != ResponseCode.SUCCESS:
        response.ext_fields.update(region_fields(server))
    return response


def region_fields(server: Broker) -> dict[str, str]:
    return {
        "TRACE_ON": "true" if server.config.traceOn else "false",
        "MSG_REGION": server.config.regionId,
    }


def _sys_flag(cmd: RemotingCommand, tcfg: TopicConfig) -> int:
    cmd.require("sysFlag")
    sys_flag = cmd.field_int("sysFlag", bits=32)
    if tcfg.topicFilterType == "MULTI_TAG":
        sys_flag |= MessageSysFlag.MULTI_TAGS  # SendMessageProcessor, single and batch
    return sys_flag


def _send_message(server: Broker, conn: Peer, request: RemotingCommand) -> HandlerResult:
    store = server.store
    assert store is not None
    accepted = accept(server, conn, request)
    if isinstance(accepted, RemotingCommand):
        return accepted
    cmd, tcfg, queue_id = accepted
    topic = cmd.ext_fields["topic"]
    props_text = cmd.ext_fields.get("properties", "")
    properties = decode_properties(props_text)
    properties[Prop.CLUSTER] = server.config.brokerClusterName
    base = MessageExt(
        topic=topic,
        queue_id=queue_id,
        born_host=conn.peer_host,
        reconsume_times=cmd.field_int("reconsumeTimes", 0),
    )
    # Java decides on the header's batch field alone (SendMessageProcessor
    # .asyncProcessRequest): even code 320 without batch=true is a single message.
    if _java_bool(cmd.ext_fields.get("batch")):
        return _send_batch(server, request, cmd, tcfg, base, properties)
    base.body = cmd.body
    base.properties = properties
    # --- %RETRY% sends (the Java client's fallback when send-back fails) ---
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        gcfg = store.groups.find_or_create(group)
        if gcfg is None:
            return request.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {group} {FAQ}",
            )
        max_times = gcfg.retryMaxTimes
        if request.version >= V3_4_9 and cmd.ext_fields.get("maxReconsumeTimes"):
            max_times = cmd.field_int("maxReconsumeTimes")
        if base.reconsume_times >= max_times:
            dlq = store.topics.create_system(dlq_topic(group), 1, Perm.READ | Perm.WRITE)
            base.topic, base.queue_id = dlq.topicName, 0
            # RocketMQ 4.9.7's handleRetryAndDLQ clears the delay level, but the request's
            # properties are put back after it: the client's DELAY stands, so the message
            # reaches the DLQ only once that level has passed (the Java orderly consumer's
            # send-back at its last attempt: level 3 + attempts, measured: 1 min at 2)
    base.sys_flag = _sys_flag(cmd, tcfg)  # read where handleRetryAndDLQ ends, then these
    cmd.require("flag", "bornTimestamp")
    base.flag = cmd.field_int("flag", bits=32)
    base.born_timestamp = cmd.field_int("bornTimestamp")
    keep_wait = False
    reply_queue = queue_id
    if properties.get(Prop.TRAN_MSG, "").lower() == "true":
        if server.config.rejectTransactionMessage:
            return request.response(
                ResponseCode.NO_PERMISSION,
                f"the broker[{server.config.brokerIP1}] sending transaction message is forbidden",
            )
        base.properties[Prop.REAL_TOPIC] = base.topic
        base.properties[Prop.REAL_QID] = str(base.queue_id)
        base.sys_flag &= ~MessageSysFlag.TRANSACTION_MASK
        base.topic, base.queue_id = TRANS_HALF_TOPIC, 0
        keep_wait = True
    refused = _refused(server, request, props_text)
    if refused is not None:
        return refused
    try:
        result = store.put(base, keep_wait=keep_wait)
    except MessageFormatError:
        return illegal(server, request)
    # counted under the topic stored in, as SendMessageProcessor counts its msgInner after
    # the store renamed it: SCHEDULE_TOPIC_XXXX for a delay, the half topic for a half
    count_put(server, result.topic, 1, result.end - result.commit_log_offset)
    if result.topic == SCHEDULE_TOPIC:
        count_schedule_put(server, result)
    response = request.response(
        ResponseCode.SUCCESS,
        ext_fields={
            "queueId": str(reply_queue),
            **region_fields(server),
            "msgId": offset_msg_id(store.store_host, result.commit_log_offset),
            "queueOffset": str(result.queue_offset),
        },
    )
    return _after_flush(server, response, result.end)


def _refused(server: Broker, request: RemotingCommand, props_text: str) -> RemotingCommand | None:
    """What the store says before it appends (DefaultMessageStore.checkStoreStatus, then
    the commit log's size checks): after the processor's own checks, so a full disk is
    reported before a message that is too large or a batch that does not decode."""
    store = server.store
    assert store is not None
    refusal = store.write_refusal()
    if refusal is not None:
        return request.response(ResponseCode.SERVICE_NOT_AVAILABLE, refusal)
    if (
        len(request.body) > server.config.maxMessageSize
        or len(props_text.encode("utf-8")) > MAX_PROPERTIES
    ):  # the stored text is longer still (CLUSTER added, WAIT dropped)
        return illegal(server, request)
    return None


def count_put(server: Broker, topic: str, n: int, size: int) -> None:
    """BrokerStatsManager's per-topic and per-broker put counters (statsAll, clusterList):
    ``n`` messages stored in one put of ``size`` bytes (the records as written)."""
    stats = server.store.stats if server.store is not None else None
    if stats is not None:
        stats.add(TOPIC_PUT_NUMS, topic, n)
        stats.add(TOPIC_PUT_SIZE, topic, size)
        stats.add(BROKER_PUT_NUMS, server.config.brokerClusterName, n)


def count_schedule_put(server: Broker, result: PutResult) -> None:
    """QUEUE_PUT_*: SendMessageProcessor counts a queue's put only for the schedule topic."""
    store = server.store
    assert store is not None
    key = f"{result.topic}@{result.queue_id}"
    store.stats.add(QUEUE_PUT_NUMS, key, 1)
    store.stats.add(QUEUE_PUT_SIZE, key, result.end - result.commit_log_offset)


def _after_flush(server: Broker, response: RemotingCommand, end: int) -> HandlerResult:
    store = server.store
    assert store is not None
    if not server.config.sync_flush:
        return response

    async def wait() -> RemotingCommand:
        if not await store.wait_flushed(end):
            response.code = ResponseCode.FLUSH_DISK_TIMEOUT
        return response

    return wait()


def _send_batch(
    server: Broker,
    request: RemotingCommand,
    cmd: RemotingCommand,
    tcfg: TopicConfig,
    base: MessageExt,
    outer: dict[str, str],
) -> HandlerResult:
    """asyncSendBatchMessage, then the store's checks in their order. A batch is stored
    as it comes: to a retry topic too (no group or dead-letter handling, as 4.9.7), and
    its entries' DELAY and TRAN_MSG are kept, never read; only the batch's own header
    (its sysFlag, its DELAY) refuses a delayed or transactional batch."""
    store = server.store
    assert store is not None
    base.sys_flag = _sys_flag(cmd, tcfg)
    cmd.require("flag", "bornTimestamp")
    base.flag = cmd.field_int("flag", bits=32)
    base.born_timestamp = cmd.field_int("bornTimestamp")
    refusal = store.write_refusal()  # DefaultMessageStore.asyncPutMessages
    if refusal is not None:
        return request.response(ResponseCode.SERVICE_NOT_AVAILABLE, refusal)
    if not request.body:
        raise _NO_BATCH_BODY
    if len(request.body) > server.config.maxMessageSize:
        return illegal(server, request)
    if base.sys_flag & MessageSysFlag.TRANSACTION_MASK:  # CommitLog.asyncPutMessages
        return illegal(server, request)
    delay = outer.get(Prop.DELAY)
    if delay is not None and java_int(delay) > 0:
        return illegal(server, request)
    outer_text = encode_stored_properties(outer)
    if len(outer_text.encode("utf-8")) > MAX_PROPERTIES:
        raise _BATCH_PROPERTIES_TOO_LONG
    try:
        raw_entries = read_batch(request.body)
        texts = [e.properties.decode("utf-8") for e in raw_entries]
    except (MalformedEntry, UnicodeDecodeError):
        return illegal(server, request)
    stored_texts = [_entry_text(inner, outer_text) for inner in texts]
    if any(len(text.encode("utf-8")) > MAX_PROPERTIES for text in stored_texts):
        return illegal(server, request)  # RocketMQ writes such a record unreadable
    ids: list[str] = []
    first_offset = first_phy = -1
    end = 0
    stamped = int(time.time() * 1000)  # CommitLog.putMessages: one store time for the batch
    for entry, inner_text, stored_text in zip(raw_entries, texts, stored_texts):
        msg = MessageExt(
            topic=base.topic,
            queue_id=base.queue_id,
            body=entry.body,
            flag=entry.flag,
            properties={**decode_properties(inner_text), **outer},
            sys_flag=base.sys_flag,
            born_timestamp=base.born_timestamp,
            born_host=base.born_host,
            reconsume_times=base.reconsume_times,
        )
        try:
            # RocketMQ stores the entries' DELAY as text and schedules none of them
            result = store.put(
                msg,
                keep_wait=True,
                apply_delay=False,
                properties_text=stored_text,
                store_timestamp=stamped,
            )
        except MessageFormatError:
            return illegal(server, request)
        if first_offset < 0:
            first_offset, first_phy = result.queue_offset, result.commit_log_offset
        ids.append(offset_msg_id(store.store_host, result.commit_log_offset))
        end = result.end
    count_put(server, base.topic, len(raw_entries), end - first_phy)
    response = request.response(
        ResponseCode.SUCCESS,
        ext_fields={
            "queueId": str(base.queue_id),
            **region_fields(server),
            "msgId": ",".join(ids),
            "queueOffset": str(first_offset),
        },
    )
    return _after_flush(server, response, end)


def _entry_text(inner: str, outer: str) -> str:
    """CommitLog.MessageExtBatchEncoder: the entry's own text, a separator unless it
    ends in one, then the batch's properties (WAIT included), not re-encoded from a map."""
    sep = PROPERTY_SEPARATOR if inner and not inner.endswith(PROPERTY_SEPARATOR) else ""
    return inner + sep + outer


def send_back_properties(msg: MessageExt, delay_level: int) -> dict[str, str]:
    """A sent-back copy's properties, as consumerSendMsgBack sets them (4.9.7 and 5.3.3):
    where it came from (RETRY_TOPIC, ORIGIN_MESSAGE_ID, kept from an earlier copy) and its
    delay level, 0 for a dead letter."""
    props = dict(msg.properties)
    props.setdefault(Prop.RETRY_TOPIC, msg.topic)
    props[Prop.WAIT] = "false"
    props[Prop.DELAY] = str(delay_level)
    if not props.get(Prop.ORIGIN_MESSAGE_ID):
        props[Prop.ORIGIN_MESSAGE_ID] = msg.offset_msg_id
    return props


def send_back(server: Broker, conn: Peer, cmd: RemotingCommand) -> HandlerResult:
    cmd.require("offset", "group", "delayLevel")
    store = server.store
    assert store is not None
    group = cmd.ext_fields["group"]
    gcfg = store.groups.find_or_create(group)
    if gcfg is None:
        return cmd.response(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            f"subscription group not exist, {group} {FAQ}",
        )
    if not server.config.brokerPermission & Perm.WRITE:
        return cmd.response(
            ResponseCode.NO_PERMISSION,
            f"the broker[{server.config.brokerIP1}] sending message is forbidden",
        )
    if gcfg.retryQueueNums <= 0:
        return cmd.response(ResponseCode.SUCCESS)
    topic = retry_topic(group)
    tcfg = store.topics.create_system(topic, gcfg.retryQueueNums, Perm.READ | Perm.WRITE)
    if not tcfg.perm & Perm.WRITE:  # checked before the choice of retry or dead letter
        return cmd.response(
            ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
        )
    queue_id = random.randrange(gcfg.retryQueueNums)
    offset = cmd.field_int("offset")
    msg = store.lookup(offset)
    if msg is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
    delay_level = cmd.field_int("delayLevel")
    max_times = gcfg.retryMaxTimes
    if cmd.version >= V3_4_9 and cmd.ext_fields.get("maxReconsumeTimes"):
        max_times = cmd.field_int("maxReconsumeTimes")
    if msg.reconsume_times >= max_times or delay_level < 0:
        tcfg = store.topics.create_system(dlq_topic(group), 1, Perm.READ | Perm.WRITE)
        queue_id = 0
        delay_level = 0
    elif delay_level == 0:
        delay_level = 3 + msg.reconsume_times
    props = send_back_properties(msg, delay_level)
    retry = MessageExt(
        topic=tcfg.topicName,
        queue_id=queue_id,
        body=msg.body,
        flag=msg.flag,
        properties=props,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times + 1,
    )
    if store.disk.full:  # the put's status by name (consumerSendMsgBack)
        return cmd.response(ResponseCode.SYSTEM_ERROR, "SERVICE_NOT_AVAILABLE")
    result = store.put(retry, keep_wait=True)
    if result.topic == SCHEDULE_TOPIC:  # consumerSendMsgBack counts a delayed one's put
        store.stats.add(TOPIC_PUT_NUMS, result.topic, 1)
        store.stats.add(TOPIC_PUT_SIZE, result.topic, result.end - result.commit_log_offset)
        count_schedule_put(server, result)
    back_topic = msg.properties.get(Prop.RETRY_TOPIC) or msg.topic
    store.stats.add(SNDBCK_PUT_NUMS, f"{back_topic}@{group}", 1)
    return _after_flush(server, cmd.response(ResponseCode.SUCCESS), result.end)
