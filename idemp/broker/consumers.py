"""Client bookkeeping requests: HEART_BEAT, UNREGISTER_CLIENT, CHECK_CLIENT_CONFIG,
GET_CONSUMER_LIST_BY_GROUP, QUERY/UPDATE_CONSUMER_OFFSET, LOCK/UNLOCK_BATCH_MQ."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode, jsonlenient
from idemp.remoting.codes import Perm, TopicSysFlag
from idemp.remoting.sql92 import SelectorError, compile_selector

from .clients import is_tag_type
from .metadata import retry_topic

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer

# RocketMQ treats message 0 as "in memory" (so a new group starts at 0 even with
# CONSUME_FROM_LAST_OFFSET) while it is within 40% of physical memory of the log end.
ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO = 40


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.HEART_BEAT] = heartbeat
    handlers[RequestCode.UNREGISTER_CLIENT] = unregister_client
    handlers[RequestCode.CHECK_CLIENT_CONFIG] = check_client_config
    handlers[RequestCode.GET_CONSUMER_LIST_BY_GROUP] = consumer_list
    handlers[RequestCode.QUERY_CONSUMER_OFFSET] = query_offset
    handlers[RequestCode.UPDATE_CONSUMER_OFFSET] = update_offset
    handlers[RequestCode.LOCK_BATCH_MQ] = lock_batch
    handlers[RequestCode.UNLOCK_BATCH_MQ] = unlock_batch


def _json_body(cmd: RemotingCommand) -> dict[str, Any]:
    try:
        data = jsonlenient.loads(cmd.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("request body is not a JSON object")
    return data


def heartbeat(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    store = server.store
    assert store is not None
    body = _json_body(cmd)
    for data in body.get("consumerDataSet") or []:
        group = str(data.get("groupName", ""))
        gcfg = store.groups.find_or_create(group) if group else None
        if gcfg is not None:  # a unit-mode consumer's with the unit-subscription flag
            store.topics.create_system(
                retry_topic(group),
                gcfg.retryQueueNums,
                Perm.READ | Perm.WRITE,
                TopicSysFlag.UNIT_SUB if data.get("unitMode") is True else 0,
            )
    for group in server.clients.heartbeat(conn, body, cmd.language, cmd.version):
        server.notify_consumer_ids_changed(group)
    return cmd.response(ResponseCode.SUCCESS)


def unregister_client(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    # no clientID check: RocketMQ 4.9.7 unregisters the connection's groups without one
    group = cmd.ext_fields.get("consumerGroup")
    if group is not None and server.store is not None:
        # findSubscriptionGroupConfig (for its notify flag) creates the group if it may:
        # a consumer that leaves before its first heartbeat leaves its group behind
        server.store.groups.find_or_create(group)
    changed = server.clients.unregister(conn, group, cmd.ext_fields.get("producerGroup"))
    for group in changed:
        server.notify_consumer_ids_changed(group)
    return cmd.response(ResponseCode.SUCCESS)


# RocketMQ 4.9.7 answers with the message of the NullPointerException it meets (no filter of
# that name): null on Java 8, this text on the Java 17 it runs on here (helpful NPE messages)
NO_SUCH_FILTER = (
    'Cannot invoke "org.apache.rocketmq.filter.FilterSpi.compile(String)" because the return '
    'value of "org.apache.rocketmq.filter.FilterFactory.get(String)" is null'
)


def check_client_config(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """What a Java consumer with an SQL92 selector asks at start
    (ClientManageProcessor.checkClientConfig): refused when the broker does not filter
    by properties, or when the expression does not compile, so that the consumer fails
    to start instead of receiving nothing."""
    sub = _json_body(cmd).get("subscriptionData")  # no body: refused, as on RocketMQ
    if isinstance(sub, dict) and not is_tag_type(sub.get("expressionType")):
        expression_type = str(sub["expressionType"])
        if not server.config.enablePropertyFilter:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {expression_type}",
            )
        if expression_type != "SQL92":  # RocketMQ has no filter of that name
            return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, NO_SUCH_FILTER)
        try:
            compile_selector(str(sub.get("subString") or ""))
        except SelectorError as exc:
            return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
    return cmd.response(ResponseCode.SUCCESS)


def consumer_list(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    cmd.require("consumerGroup")
    group = cmd.ext_fields["consumerGroup"]
    info = server.clients.consumers.get(group)
    if info is None or not info.channels:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
    body = json.dumps({"consumerIdList": info.client_ids()}, separators=(",", ":"))
    return cmd.response(ResponseCode.SUCCESS, body=body.encode())


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover
        return 8 << 30


def query_offset(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    cmd.require("consumerGroup", "topic", "queueId")
    store = server.store
    assert store is not None
    group, topic, qid = (
        cmd.ext_fields["consumerGroup"],
        cmd.ext_fields["topic"],
        cmd.field_int("queueId"),
    )
    offset = store.offsets.query(group, topic, qid)
    if offset is not None and offset >= 0:
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})
    cq = store.find_queue(topic, qid)
    in_memory = True
    if cq is not None and cq.max_offset > 0:
        behind = store.commitlog.end - cq.phy[cq.min_offset]
        in_memory = behind <= _total_memory() * ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO // 100
    if store.min_offset(topic, qid) <= 0 and in_memory:
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})
    return cmd.response(
        ResponseCode.QUERY_NOT_FOUND,
        "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
    )


def update_offset(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    cmd.require("consumerGroup", "topic", "queueId", "commitOffset")
    store = server.store
    assert store is not None
    store.offsets.commit(
        cmd.ext_fields["consumerGroup"],
        cmd.ext_fields["topic"],
        cmd.field_int("queueId"),
        cmd.field_int("commitOffset"),
    )
    return cmd.response(ResponseCode.SUCCESS)


def _lock_body(cmd: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
    """The group, client and queues of a lock request. No queues is no work, whatever
    else is missing (RocketMQ answers SUCCESS with an empty set before it looks)."""
    body = _json_body(cmd)
    mqs: list[tuple[str, str, int]] = []
    for mq in body.get("mqSet") or []:
        try:
            mqs.append((str(mq["topic"]), str(mq["brokerName"]), int(mq["queueId"])))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"invalid message queue in lock body: {mq!r}") from None
    group = body.get("consumerGroup")
    client_id = body.get("clientId")
    if mqs and (not isinstance(group, str) or not isinstance(client_id, str)):
        raise ValueError("lock body needs consumerGroup and clientId")
    return str(group), str(client_id), mqs


def lock_batch(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    group, client_id, mqs = _lock_body(cmd)
    won = server.locks.try_lock_batch(group, mqs, client_id)
    body = json.dumps(
        {"lockOKMQSet": [{"brokerName": b, "queueId": q, "topic": t} for t, b, q in won]},
        separators=(",", ":"),
    )
    return cmd.response(ResponseCode.SUCCESS, body=body.encode())


def unlock_batch(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    group, client_id, mqs = _lock_body(cmd)
    server.locks.unlock_batch(group, mqs, client_id)
    return cmd.response(ResponseCode.SUCCESS)
