"""Offset look-ups, message look-ups and topic/group administration."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode, jsonlenient
from idemp.remoting.codes import (
    UNSET_RESPONSE_REMARK,
    Perm,
)
from idemp.remoting.javaparse import JavaError

from .admin_maintenance import is_system_topic
from .metadata import (
    MESSAGE_TYPE_ATTRIBUTE,
    TOPIC_FILTER_TYPES,
    TopicConfig,
    group_from_json,
    parse_attributes,
    topic_error,
    topic_json,
)
from .namesrv import registered_one, sync_order_topics

if TYPE_CHECKING:
    from .context import Broker, Handler, HandlerResult, Peer

DEFAULT_QUERY_MAX_NUM = 32
MAX_MSGS_NUM_BATCH = 64


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.GET_MAX_OFFSET] = max_offset
    handlers[RequestCode.GET_MIN_OFFSET] = min_offset
    handlers[RequestCode.SEARCH_OFFSET_BY_TIMESTAMP] = search_offset
    handlers[RequestCode.GET_EARLIEST_MSG_STORETIME] = earliest_time
    handlers[RequestCode.VIEW_MESSAGE_BY_ID] = view_message
    handlers[RequestCode.QUERY_MESSAGE] = query_message
    handlers[RequestCode.UPDATE_AND_CREATE_TOPIC] = create_topic
    handlers[RequestCode.GET_ALL_TOPIC_CONFIG] = all_topics
    handlers[RequestCode.GET_TOPIC_CONFIG] = topic_config
    handlers[RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP] = create_group
    handlers[RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG] = all_groups


def _queue(cmd: RemotingCommand) -> tuple[str, int]:
    cmd.require("topic", "queueId")
    return cmd.ext_fields["topic"], cmd.field_int("queueId")


def max_offset(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    topic, qid = _queue(cmd)
    return cmd.response(
        ResponseCode.SUCCESS, ext_fields={"offset": str(server.store.max_offset(topic, qid))}
    )


def min_offset(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    topic, qid = _queue(cmd)
    return cmd.response(
        ResponseCode.SUCCESS, ext_fields={"offset": str(server.store.min_offset(topic, qid))}
    )


def search_offset(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    topic, qid = _queue(cmd)
    ts = cmd.field_int("timestamp")
    cq = server.store.find_queue(topic, qid)
    offset = cq.offset_by_time(ts) if cq is not None else 0
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})


def earliest_time(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    topic, qid = _queue(cmd)
    cq = server.store.find_queue(topic, qid)
    ts = cq.store_time(cq.min_offset) if cq is not None else -1
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"timestamp": str(ts)})


def view_message(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    cmd.require("offset")
    offset = cmd.field_int("offset")
    msg = server.store.lookup(offset)
    record = server.store.read_record(offset) if msg is not None else None
    if record is None:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
        )
    return cmd.response(ResponseCode.SUCCESS, body=record)


def query_message(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    cmd.require("maxNum", "beginTimestamp", "endTimestamp")
    max_num = min(cmd.field_int("maxNum"), MAX_MSGS_NUM_BATCH)
    if cmd.ext_fields.get("_UNIQUE_KEY_QUERY") == "true":
        max_num = DEFAULT_QUERY_MAX_NUM
    if max_num < 0:  # IndexService.queryOffset sizes its list by it
        raise JavaError(
            f"java.lang.IllegalArgumentException: Illegal Capacity: {max_num}, "
            "java.base/java.util.ArrayList.<init>(ArrayList.java:160)"
        )
    records = server.store.query_by_key(
        # the index key is topic#key, concatenated: an absent one reads "null"
        cmd.ext_fields.get("topic", "null"),
        cmd.ext_fields.get("key", "null"),
        max_num,
        cmd.field_int("beginTimestamp"),
        cmd.field_int("endTimestamp"),
    )
    # DefaultMessageStore.queryMessage: the index's end when something was found
    end_timestamp, end_offset = server.store.index_end if records else (0, 0)
    ext = {
        "indexLastUpdateTimestamp": str(end_timestamp),
        "indexLastUpdatePhyoffset": str(end_offset),
    }
    if not records:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", ext
        )
    return cmd.response(ResponseCode.SUCCESS, ext_fields=ext, body=b"".join(records))


def create_topic(server: Broker, conn: Peer, cmd: RemotingCommand) -> HandlerResult:
    assert server.store is not None
    # CreateTopicRequestHeader.checkFields, before anything else is looked at
    filter_type = cmd.ext_fields.get("topicFilterType")
    if filter_type not in TOPIC_FILTER_TYPES:
        # the RemotingCommandException checkFields throws, as the remoting layer words it
        text = "null" if filter_type is None else filter_type
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            "org.apache.rocketmq.remoting.exception.RemotingCommandException: "
            f"topicFilterType = [{text}] value invalid, "
            "org.apache.rocketmq.common.protocol.header.CreateTopicRequestHeader"
            ".checkFields(CreateTopicRequestHeader.java:50)",
        )
    cmd.require("topic", "readQueueNums", "writeQueueNums", "perm")
    topic = cmd.ext_fields["topic"]
    err = topic_error(topic)
    if err:
        return cmd.response(ResponseCode.SYSTEM_ERROR, err)
    # TopicValidator.isSystemTopic: TBW102, SCHEDULE_TOPIC_XXXX, the transaction topics,
    # the cluster's and the broker's own names, the reply topic... are the broker's own;
    # re-creating TBW102 could e.g. switch off auto-creation.
    if is_system_topic(server, topic):
        return cmd.response(
            ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
        )
    # the counts as given, as RocketMQ sets them: writeQueueNums 0 drains a topic
    read, write = cmd.field_int("readQueueNums"), cmd.field_int("writeQueueNums")
    try:
        attributes = parse_attributes(cmd.ext_fields.get("attributes") or "")
    except ValueError as exc:
        return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
    mixed = attributes.get(MESSAGE_TYPE_ATTRIBUTE) == "MIXED"
    if mixed and not server.config.enableMixedMessageType:
        # RocketMQ 5.3.3's AdminBrokerProcessor, with its default enableMixedMessageType
        return cmd.response(ResponseCode.INVALID_PARAMETER, "MIXED message type is not supported.")
    version_before = server.store.topics.version.counter
    server.store.topics.put(
        TopicConfig(
            topic,
            read,
            write,
            cmd.field_int("perm", Perm.READ | Perm.WRITE),
            filter_type,
            cmd.field_int("topicSysFlag", 0),
            False,  # RocketMQ takes no order from the request: the nameserver's KV says
            attributes,
        )
    )
    if server.config.embeddedNamesrv:  # the registration's answer, here at once
        registered_one(server, version_before)
        sync_order_topics(server)
    done = cmd.response(ResponseCode.SUCCESS, UNSET_RESPONSE_REMARK)
    if server.registrar is not None:  # registerIncrementBrokerData: before the answer
        return server.registrar.after_registering(done)
    return done


def all_topics(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    body = server.store.topics.to_json()  # as fastjson writes it: sorted, no spaces
    return cmd.response(ResponseCode.SUCCESS, body=jsonlenient.dumps(body).encode())


def topic_config(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """RocketMQ 5's GET_TOPIC_CONFIG: one topic's config (no static-topic mapping here)."""
    assert server.store is not None
    cmd.require("topic")
    topic = cmd.ext_fields["topic"]
    cfg = server.store.topics.get(topic)
    if cfg is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {topic}"
        )
    # a RocketMQ 5 request: "attributes" always there, {} when none (RocketMQ 5.3.3)
    body = {**topic_json(cfg), "attributes": dict(cfg.attributes)}
    return cmd.response(ResponseCode.SUCCESS, body=json.dumps(body).encode())


def create_group(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    try:
        data = jsonlenient.loads(cmd.body)
        cfg = group_from_json(data if isinstance(data, dict) else {})
    except (ValueError, TypeError) as exc:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"invalid subscription group config: {exc}")
    server.store.groups.put(cfg)
    return cmd.response(ResponseCode.SUCCESS)


def all_groups(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    assert server.store is not None
    body = server.store.groups.to_json()
    return cmd.response(ResponseCode.SUCCESS, body=jsonlenient.dumps(body).encode())
