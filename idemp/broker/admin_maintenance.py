"""Deleting topics and groups, cloning offsets, reading a consume queue, housekeeping.

As RocketMQ 4.9.7's AdminBrokerProcessor: ``mqadmin deleteTopic``, ``deleteSubGroup``,
``cloneGroupOffset``, ``queryCq``, ``cleanExpiredCQ``, ``cleanUnusedTopic``,
``deleteExpiredCommitLog`` and the system topic list of ``exportMetadata``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import (
    DEFAULT_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    SYSTEM_TOPICS,
    UNSET_RESPONSE_REMARK,
)
from idemp.remoting.javahash import hash_map_order
from idemp.remoting.jsonlenient import dumps

from .metadata import topic_error

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer

log = logging.getLogger("idemp.broker.admin")


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.DELETE_TOPIC_IN_BROKER] = delete_topic
    handlers[RequestCode.DELETE_SUBSCRIPTIONGROUP] = delete_group
    handlers[RequestCode.CLONE_GROUP_OFFSET] = clone_group_offset
    handlers[RequestCode.QUERY_CONSUME_QUEUE] = query_consume_queue
    handlers[RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER] = system_topics
    # The store keeps every file until the broker is stopped: nothing is expired, so
    # these housekeeping requests have nothing to do and succeed, as on RocketMQ when
    # nothing is due.
    handlers[RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE] = nothing_to_clean
    handlers[RequestCode.DELETE_EXPIRED_COMMITLOG] = nothing_to_clean
    handlers[RequestCode.CLEAN_UNUSED_TOPIC] = nothing_to_clean


# TopicValidator's static SYSTEM_TOPIC_SET, in the order its static block adds them
_STATIC_SYSTEM_TOPICS = (
    DEFAULT_TOPIC,
    "SCHEDULE_TOPIC_XXXX",
    "BenchmarkTest",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT",
)


def system_topic_list(server: Broker) -> list[str]:
    """TopicValidator's system topic set as this broker has it, in the order the set
    was filled: the static ones, then what TopicConfigManager adds (the cluster's and
    the broker's names, a trace topic of another name, the reply topic)."""
    cfg = server.config
    added = [cfg.brokerClusterName, cfg.brokerName]
    if cfg.traceTopicEnable:
        added.append(cfg.msgTraceTopicName)
    added.append(f"{cfg.brokerClusterName}_REPLY_TOPIC")
    return list(dict.fromkeys([*_STATIC_SYSTEM_TOPICS, *SYSTEM_TOPICS, *added]))


def is_system_topic(server: Broker, topic: str) -> bool:
    """TopicValidator.isSystemTopic: what neither updateTopic nor deleteTopic may touch."""
    return topic in system_topic_list(server) or topic.startswith(SYSTEM_TOPIC_PREFIX)


def delete_topic(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    store = server.store
    assert store is not None
    topic = cmd.ext_fields.get("topic", "")  # none: blank, as RocketMQ validates it
    error = topic_error(topic)
    if error is not None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, error)
    if is_system_topic(server, topic):
        return cmd.response(
            ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
        )
    log.info("deleteTopic %s called by %s", topic, conn.peer)
    store.delete_topic(topic)
    return cmd.response(ResponseCode.SUCCESS)


def delete_group(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    store = server.store
    assert store is not None
    cmd.require("groupName")
    group = cmd.ext_fields["groupName"]
    log.info("deleteSubscriptionGroup %s called by %s", group, conn.peer)
    store.groups.remove(group)
    # 4.9.7 names the flag removeOffset, RocketMQ 5 (its mqadmin deleteSubGroup -r) cleanOffset
    if any(
        (cmd.ext_fields.get(n) or "").lower() == "true" for n in ("removeOffset", "cleanOffset")
    ):
        store.offsets.remove_group(group)
    return cmd.response(ResponseCode.SUCCESS)


def clone_group_offset(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """Copies ``topic@srcGroup``'s offsets to ``topic@destGroup``. As in RocketMQ, the
    copy is keyed by the request's topic: with no topic, nothing is copied."""
    store = server.store
    assert store is not None
    cmd.require("srcGroup", "destGroup")
    src, dest = cmd.ext_fields["srcGroup"], cmd.ext_fields["destGroup"]
    topic = cmd.ext_fields.get("topic") or ""
    offline = (cmd.ext_fields.get("offline") or "false").lower() == "true"
    topics = [topic] if topic.strip() else store.offsets.topics_of(src)
    for t in topics:
        if store.topics.get(t) is None:
            continue
        if not offline:
            info = server.clients.consumers.get(src)
            if info is not None and info.subscriptions and t not in info.subscriptions:
                continue
        store.offsets.clone(src, dest, topic)
    return cmd.response(ResponseCode.SUCCESS)


def query_consume_queue(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    store = server.store
    assert store is not None
    cmd.require("topic", "queueId", "index", "count")
    topic, qid = cmd.ext_fields["topic"], cmd.field_int("queueId")
    index, count = cmd.field_int("index"), cmd.field_int("count")
    cq = store.find_queue(topic, qid)
    if cq is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"{qid}@{topic} is not exist!")
    body: dict[str, Any] = {"maxQueueIndex": cq.max_offset, "minQueueIndex": cq.min_offset}
    group = cmd.ext_fields.get("consumerGroup")
    if group is not None:
        info = server.clients.consumers.get(group)
        sub = info.subscriptions.get(topic) if info is not None else None
        if sub is None:
            body["filterData"] = f"{group}@{topic} is not online!"
        else:
            body["subscriptionData"] = {
                "classFilterMode": False,
                "codeSet": sorted(sub.codes) if sub.codes else [],
                "expressionType": sub.expression_type,
                "subString": sub.sub_string,
                "subVersion": sub.sub_version,
                "tagsSet": sorted(sub.tags),
                "topic": topic,
            }
            body["filterData"] = "null"  # no SQL92 filter data kept for tag subscriptions
    if not cq.min_offset <= index < cq.max_offset:
        return cmd.response(ResponseCode.SUCCESS, f"Index {index} of {qid}@{topic} is not exist!")
    rows = [
        {
            "eval": False,
            "physicOffset": cq.phy[i],
            "physicSize": cq.size[i],
            "tagsCode": cq.tags[i],
        }
        for i in range(index, min(cq.max_offset, index + max(0, count)))
    ]
    body["queueData"] = rows
    return cmd.response(ResponseCode.SUCCESS, UNSET_RESPONSE_REMARK, body=dumps(body).encode())


def system_topics(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(
        # a HashSet, listed in its own order
        ResponseCode.SUCCESS,
        body=dumps({"topicList": hash_map_order(system_topic_list(server))}).encode(),
    )


def nothing_to_clean(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS)
