"""Admin requests the broker passes on to its consumers (Broker2Client in RocketMQ).

``mqadmin consumerStatus`` (a consumer's running info), ``consumeMessage`` (consume one
stored message directly), ``resetOffsetByTime`` (online consumers are told their new
offsets) and ``getConsumerStatus`` reach the clients through the broker: it finds the
client's connection, asks, and answers with the client's reply.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import UNSET_RESPONSE_REMARK
from idemp.remoting.jsonlenient import ObjectKeyMap, dumps, mq
from idemp.remoting.mqversion import ordinal, version_desc
from idemp.remoting.msgid import parse_offset_msg_id

if TYPE_CHECKING:
    from .clients import ClientChannel
    from .context import Broker, Handler, Peer

CALL_CLIENT_TIMEOUT_MS = 10_000  # Broker2Client.callClient: running info, consume directly
TIMEOUT_EXCEPTION = "org.apache.rocketmq.remoting.exception.RemotingTimeoutException"
INVOKE_SYNC_FRAME = (
    "org.apache.rocketmq.remoting.netty.NettyRemotingAbstract.invokeSyncImpl"
    "(NettyRemotingAbstract.java:439)"
)
V3_0_7 = ordinal("V3_0_7_SNAPSHOT")  # oldest client that can reset (28)
V3_1_8 = ordinal("V3_1_8_SNAPSHOT")  # oldest that answers running-info requests (62)


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.GET_CONSUMER_RUNNING_INFO] = consumer_running_info
    handlers[RequestCode.CONSUME_MESSAGE_DIRECTLY] = consume_message_directly
    handlers[RequestCode.INVOKE_BROKER_TO_RESET_OFFSET] = reset_offset
    handlers[RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS] = consumer_status


def _find(server: Broker, group: str, client_id: str) -> ClientChannel | None:
    info = server.clients.consumers.get(group)
    if info is None:
        return None
    return next((c for c in info.channels.values() if c.client_id == client_id), None)


async def _call_consumer(
    server: Broker, cmd: RemotingCommand, group: str, client_id: str, body: bytes
) -> RemotingCommand:
    """AdminBrokerProcessor.callConsumer: the client's answer to the same request."""
    chan = _find(server, group, client_id)
    if chan is None:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online"
        )
    if chan.version < V3_1_8:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            f"The Consumer <{client_id}> Version <{version_desc(chan.version)}> too low to finish, "
            "please upgrade it to V3_1_8_SNAPSHOT",
        )
    try:
        answer = await chan.channel.invoke(
            cmd.code, dict(cmd.ext_fields), body, timeout=CALL_CLIENT_TIMEOUT_MS / 1000
        )
    except asyncio.TimeoutError:
        # RemotingHelper.exceptionSimpleDesc of the RemotingTimeoutException invokeSync throws
        return cmd.response(
            ResponseCode.CONSUME_MSG_TIMEOUT,
            f"consumer <{group}> <{client_id}> Timeout: {TIMEOUT_EXCEPTION}: wait response on "
            f"the channel <{chan.channel.peer}> timeout, {CALL_CLIENT_TIMEOUT_MS}(ms), "
            f"{INVOKE_SYNC_FRAME}",
        )
    except Exception as exc:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            f"invoke consumer <{group}> <{client_id}> Exception: {exc}",
        )
    # the client's answer, under the admin's request id
    return replace(answer, opaque=cmd.opaque, serialize_type=cmd.serialize_type)


async def consumer_running_info(
    server: Broker, conn: Peer, cmd: RemotingCommand
) -> RemotingCommand:
    cmd.require("consumerGroup", "clientId")
    return await _call_consumer(
        server, cmd, cmd.ext_fields["consumerGroup"], cmd.ext_fields["clientId"], cmd.body
    )


async def consume_message_directly(
    server: Broker, conn: Peer, cmd: RemotingCommand
) -> RemotingCommand:
    """The stored record of ``msgId`` is sent to the client, which consumes it."""
    store = server.store
    assert store is not None
    cmd.require("consumerGroup", "clientId", "msgId")
    cmd.ext_fields["brokerName"] = server.config.brokerName
    body = b""
    try:
        _, offset = parse_offset_msg_id(cmd.ext_fields["msgId"])
        body = store.read_record(offset) or b""
    except ValueError:
        pass  # RocketMQ sends the request without a body then, and so do we
    return await _call_consumer(
        server, cmd, cmd.ext_fields["consumerGroup"], cmd.ext_fields["clientId"], body
    )


def reset_offset(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """Broker2Client.resetOffset: offsets by time for every queue, sent to each online
    consumer of the group (which commits them); the broker's own table is not written."""
    store = server.store
    assert store is not None
    cmd.require("topic", "group", "timestamp")
    topic, group = cmd.ext_fields["topic"], cmd.ext_fields["group"]
    timestamp = cmd.field_int("timestamp")
    force = (cmd.ext_fields.get("isForce") or "false").lower() == "true"
    tcfg = store.topics.get(topic)
    if tcfg is None:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}",
        )
    offsets: list[tuple[dict[str, Any], int]] = []
    for qid in range(tcfg.writeQueueNums):
        current = store.offsets.query(group, topic, qid)
        if current is None:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"THe consumer group <{group}> not exist"
            )
        if timestamp == -1:
            target = store.max_offset(topic, qid)
        else:
            cq = store.find_queue(topic, qid)
            target = cq.offset_by_time(timestamp) if cq is not None else 0
        target = max(0, target)
        offsets.append(
            (
                mq(topic, server.config.brokerName, qid),
                target if force or target < current else current,
            )
        )
    info = server.clients.consumers.get(group)
    if info is None or not info.channels:
        return cmd.response(
            ResponseCode.CONSUMER_NOT_ONLINE,
            f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} "
            f"Timestamp: {timestamp}",
        )
    java_body = dumps({"offsetTable": ObjectKeyMap(offsets)}).encode()
    c_body = dumps(
        {"offsetTable": [{**k, "offset": v} for k, v in offsets]}
    ).encode()  # ResetOffsetBodyForC, for a C++ admin
    # Broker2Client.resetOffset never sets isForce, so the header carries false whatever
    # the request said; a C++ consumer reads the field and exits when it is missing
    header = {"topic": topic, "group": group, "timestamp": str(timestamp), "isForce": "false"}
    is_c = cmd.language == "CPP"
    for chan in info.channels.values():
        if chan.version < V3_0_7:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                "the client does not support this feature. version=" + version_desc(chan.version),
            )
        chan.channel.send_request_oneway(
            RequestCode.RESET_CONSUMER_CLIENT_OFFSET, header, c_body if is_c else java_body
        )
    return cmd.response(ResponseCode.SUCCESS, UNSET_RESPONSE_REMARK, body=java_body)


# Broker2Client.getConsumeStatus reads the group's channels without a null check: a group
# with no consumer online fails there, and the processor answers with the exception (its
# text and first frame; this text is Java 17's, which RocketMQ runs on here)
NO_GROUP_INFO = (
    'java.lang.NullPointerException: Cannot invoke "org.apache.rocketmq.broker.client.'
    'ConsumerGroupInfo.getChannelInfoTable()" because the return value of "org.apache.'
    'rocketmq.broker.client.ConsumerManager.getConsumerGroupInfo(String)" is null, '
    "org.apache.rocketmq.broker.client.net.Broker2Client.getConsumeStatus(Broker2Client.java:243)"
)


async def consumer_status(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """Broker2Client.getConsumeStatus: each online client's offsets for the topic."""
    cmd.require("topic", "group")
    topic, group = cmd.ext_fields["topic"], cmd.ext_fields["group"]
    only = cmd.ext_fields.get("clientAddr") or ""
    info = server.clients.consumers.get(group)
    if info is None or not info.channels:  # RocketMQ drops a group with its last channel
        return cmd.response(ResponseCode.SYSTEM_ERROR, NO_GROUP_INFO)
    table: dict[str, str] = {}  # clientId -> its messageQueueTable, as JSON text
    for chan in list(info.channels.values()):
        if only and only != chan.client_id:
            continue
        try:
            answer = await chan.channel.invoke(
                RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, {"topic": topic, "group": group}
            )
        except Exception:
            continue  # RocketMQ logs and goes on with the next client
        if answer.code == ResponseCode.SUCCESS and answer.body:
            table[chan.client_id] = json_member(
                answer.body.decode("utf-8", "replace"), "messageQueueTable"
            )
        if only:
            break
    return cmd.response(ResponseCode.SUCCESS, UNSET_RESPONSE_REMARK, body=_consumer_table(table))


def json_member(text: str, name: str) -> str:
    """The text of member ``name`` of a fastjson object, as it is (its keys may be
    objects, which no JSON parser reads): found by matching brackets outside strings."""
    start = text.find(f'"{name}":')
    if start < 0:
        return "{}"
    i = start + len(name) + 3
    depth, in_string, begin = 0, False, i
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return text[begin : i + 1]
        i += 1
    return "{}"


def _consumer_table(table: dict[str, str]) -> bytes:
    """GetConsumerStatusBody: each client's table passed on as the client wrote it."""
    members = ",".join(f"{dumps(cid)}:{raw}" for cid, raw in sorted(table.items()))
    return ('{"consumerTable":{' + members + '},"messageQueueTable":{}}').encode()
