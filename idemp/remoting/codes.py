"""Request, response and flag constants of the RocketMQ 4.x remoting protocol.

Kept as plain ``IntEnum`` classes so that unknown codes arriving on the wire stay
plain ints (a server must answer them, not crash on them).
"""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_CONFIG = 26
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    CHECK_CLIENT_CONFIG = 46
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    QUERY_BROKER_OFFSET = 13
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    TRIGGER_DELETE_FILES = 27
    GET_BROKER_RUNTIME_INFO = 28
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    UPDATE_AND_CREATE_ACL_CONFIG = 50
    DELETE_ACL_CONFIG = 51
    GET_BROKER_CLUSTER_ACL_INFO = 52
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = 53
    GET_BROKER_CLUSTER_ACL_CONFIG = 54
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    GET_TOPIC_STATS_INFO = 202
    GET_TOPIC_CONFIG = 351  # RocketMQ 5 (mqadmin 5's topicStatus asks it first)
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_CONSUME_STATS = 208
    SUSPEND_CONSUMER = 209
    RESUME_CONSUMER = 210
    RESET_CONSUMER_OFFSET_IN_CONSUMER = 211
    RESET_CONSUMER_OFFSET_IN_BROKER = 212
    ADJUST_CONSUMER_THREAD_POOL = 213
    WHO_CONSUME_THE_MESSAGE = 214
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS = 223
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    REGISTER_FILTER_SERVER = 301
    REGISTER_MESSAGE_FILTER_CLASS = 302
    QUERY_CONSUME_TIME_SPAN = 303
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER = 305
    CLEAN_EXPIRED_CONSUMEQUEUE = 306
    QUERY_CORRECTION_OFFSET = 308
    GET_UNIT_TOPIC_LIST = 311
    GET_HAS_UNIT_SUB_TOPIC_LIST = 312
    GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST = 313
    CLONE_GROUP_OFFSET = 314
    VIEW_BROKER_STATS_DATA = 315
    CLEAN_UNUSED_TOPIC = 316
    GET_BROKER_CONSUME_STATS = 317
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    QUERY_CONSUME_QUEUE = 321
    QUERY_DATA_VERSION = 322
    RESUME_CHECK_HALF_MESSAGE = 323
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_ALL_PRODUCER_INFO = 328
    DELETE_EXPIRED_COMMITLOG = 329


# RemotingCommand.createResponseCommand's remark, which a handler that sets SUCCESS without
# clearing it leaves in the answer (RocketMQ 4.9.7: topic creation, QUERY_CONSUME_QUEUE,
# the broker's offset reset and consumer status)
UNSET_RESPONSE_REMARK = "not set any response code"


class ResponseCode(IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29  # RocketMQ 5's
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    FLOW_CONTROL = 215


class LanguageCode(IntEnum):
    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(IntEnum):
    JSON = 0
    ROCKETMQ = 1


# RemotingCommand.flag bits
RPC_TYPE_RESPONSE = 0x1
RPC_ONEWAY = 0x2


class PullSysFlag:
    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL = 0x10


class MessageSysFlag:
    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    TRANSACTION_MASK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80
    COMPRESSION_TYPE_MASK = 0x700
    COMPRESSION_LZ4 = 0x100
    COMPRESSION_ZSTD = 0x200
    COMPRESSION_ZLIB = 0x300


class Perm:
    PRIORITY = 8
    READ = 4
    WRITE = 2
    INHERIT = 1


class TopicSysFlag:
    """A topic's unit flags: a unit topic, one with a unit subscription (a unit-mode
    consumer's retry topic)."""

    UNIT = 0x1
    UNIT_SUB = 0x2


# Well-known topics and property keys (MessageConst / TopicValidator).
DEFAULT_TOPIC = "TBW102"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"


def pop_retry_topic(group: str, topic: str, v2: bool = False) -> str:
    """Where a RocketMQ 5 (POP) consumer group's retries of ``topic`` wait
    (KeyBuilder.buildPopRetryTopic; ``v2``: enableRetryTopicV2's ``+``)."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}{'+' if v2 else '_'}{topic}"


# TopicValidator.SYSTEM_TOPIC_PREFIX: every topic named so is the broker's own
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
# RocketMQ 5's timer (TimerMessageStore.TIMER_TOPIC): messages sent with a delivery time
# wait here, their real topic in REAL_TOPIC; a recall's marker waits beside them
TIMER_TOPIC = SYSTEM_TOPIC_PREFIX + "wheel_timer"
# where a master notes each pull whose offset it corrected (PullMessageProcessor)
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
# Clients may not send to these directly (SendMessageProcessor.msgCheck,
# TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET).
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        "SELF_TEST_TOPIC",
        OFFSET_MOVED_EVENT,
    }
)
# TopicValidator.SYSTEM_TOPIC_SET but TBW102, which callers check on its own
SYSTEM_TOPICS = NOT_ALLOWED_SEND_TOPICS | {"BenchmarkTest", "RMQ_SYS_TRACE_TOPIC"}
NAMESPACE_SEPARATOR = "%"


def _no_namespace(resource: str) -> bool:
    return (
        not resource
        or resource in SYSTEM_TOPICS
        or resource == DEFAULT_TOPIC
        or resource.startswith((SYSTEM_TOPIC_PREFIX, "CID_RMQ_SYS_"))
    )


def _retry_or_dlq_prefix(resource: str) -> str:
    for kind in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
        if resource.startswith(kind):
            return kind
    return ""


def wrap_namespace(namespace: str, resource: str) -> str:
    """A topic or group as a 4.x client with ``namespace`` names it on the wire
    (NamespaceUtil.wrapNamespace): ``Orders`` → ``ns%Orders``, ``%RETRY%g`` →
    ``%RETRY%ns%g``; the broker's own names, and names already wrapped, stay."""
    if not namespace or _no_namespace(resource):
        return resource
    prefix = _retry_or_dlq_prefix(resource)
    rest = resource[len(prefix) :]
    if rest.startswith(namespace + NAMESPACE_SEPARATOR):
        return resource
    return f"{prefix}{namespace}{NAMESPACE_SEPARATOR}{rest}"


def strip_namespace(namespace: str, resource: str) -> str:
    """``wrap_namespace`` undone, for names in ``namespace`` only (what a namespaced 4.x
    client shows its listener: NamespaceUtil.withoutNamespace(resource, namespace))."""
    if not namespace:
        return resource
    found, name = split_namespace(resource)
    return name if found == namespace else resource


def split_namespace(resource: str) -> tuple[str, str]:
    """A name a 4.x client with a namespace made (``ns%Orders``, ``%RETRY%ns%billing``) as
    (namespace, the name without it): how RocketMQ 5's proxy names a stored topic to a 5.x
    client (NamespaceUtil.getNamespaceFromResource and withoutNamespace). The broker's own
    topics and groups, and names without a namespace, have none."""
    if NAMESPACE_SEPARATOR not in resource or _no_namespace(resource):
        return "", resource  # (most names: no separator, so no namespace)
    prefix = _retry_or_dlq_prefix(resource)
    rest = resource[len(prefix) :]
    index = rest.find(NAMESPACE_SEPARATOR)
    if index <= 0:
        return "", resource
    return rest[:index], prefix + rest[index + 1 :]


class Prop:
    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    INNER_NUM = "INNER_NUM"  # RocketMQ 5: how many an inner batch holds (its broker checks it)
    PGROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    UNIQ_KEY = "UNIQ_KEY"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    MSG_REGION = "MSG_REGION"
    TRACE_ON = "TRACE_ON"
    CLUSTER = "CLUSTER"
    SHARDING_KEY = "__SHARDINGKEY"
    TRANSACTION_ID = "__transactionId__"
    # request-reply (MessageConst 4.9.7)
    CORRELATION_ID = "CORRELATION_ID"
    REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    TTL = "TTL"
    MSG_TYPE = "MSG_TYPE"
    PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
    REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
    # RocketMQ 5: a recall's marker ("<topic>+<message id>"); a POP retry's first pop
    TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
    FIRST_POP_TIME = "1ST_POP_TIME"


REPLY_MESSAGE_FLAG = "reply"  # MixAll.REPLY_MESSAGE_FLAG, the MSG_TYPE of a reply


KEY_SEPARATOR = " "
