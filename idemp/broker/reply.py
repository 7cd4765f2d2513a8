"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325): RocketMQ's request-reply.

A requester (the Java client's ``producer.request``) sends a message carrying its client
id in ``REPLY_TO_CLIENT``; the responder answers with a reply message to
``<cluster>_REPLY_TOPIC``, and the broker pushes that reply straight to the requester's
connection (PUSH_REPLY_MESSAGE_TO_CLIENT, 326) before storing it, as RocketMQ 4.9.7's
ReplyMessageProcessor does. The requester is found among the producers' connections.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from idemp.remoting import MessageExt, RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import Prop
from idemp.remoting.message import (
    MessageFormatError,
    decode_properties,
    encode_stored_properties,
)
from idemp.remoting.msgid import offset_msg_id

from .send import accept, count_put, region_fields

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer

log = logging.getLogger(__name__)

CALL_CLIENT_TIMEOUT_S = 10.0  # Broker2Client.callClient
STORE_REPLY = True  # BrokerConfig.storeReplyMessageEnable, true by default


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.SEND_REPLY_MESSAGE] = send_reply
    handlers[RequestCode.SEND_REPLY_MESSAGE_V2] = send_reply


async def send_reply(server: Broker, conn: Peer, request: RemotingCommand) -> RemotingCommand:
    store = server.store
    assert store is not None
    accepted = accept(server, conn, request)
    if isinstance(accepted, RemotingCommand):  # its response carries them from the start
        accepted.ext_fields.update(region_fields(server))
        return accepted
    cmd, _, queue_id = accepted
    fields = cmd.ext_fields
    props_text = fields.get("properties", "")
    msg = MessageExt(
        topic=fields["topic"],
        queue_id=queue_id,
        body=cmd.body,
        flag=cmd.field_int("flag"),
        properties=decode_properties(props_text),
        sys_flag=cmd.field_int("sysFlag"),
        born_timestamp=cmd.field_int("bornTimestamp"),
        born_host=conn.peer_host,
        reconsume_times=cmd.field_int("reconsumeTimes", 0),
    )
    pushed, remark = await _push(server, conn, cmd, msg, props_text)
    response = request.response(
        ResponseCode.SUCCESS if pushed else ResponseCode.SYSTEM_ERROR,
        None if pushed else remark,
        ext_fields=region_fields(server),
    )
    if pushed:  # "set to zero to avoid client decoding exception", then the stored ones
        response.ext_fields.update(msgId="0", queueId=str(queue_id), queueOffset="0")
    if STORE_REPLY:
        try:
            result = store.put(msg, keep_wait=True)  # stored as sent: WAIT kept, DELAY applied
        except MessageFormatError as exc:
            log.warning("reply message not stored: %s", exc)
            return response
        count_put(server, result.topic, 1, result.end - result.commit_log_offset)
        response.ext_fields.update(
            msgId=offset_msg_id(store.store_host, result.commit_log_offset),
            queueId=str(queue_id),
            queueOffset=str(result.queue_offset),
        )
    return response


async def _push(
    server: Broker, conn: Peer, cmd: RemotingCommand, msg: MessageExt, props_text: str
) -> tuple[bool, str]:
    """ReplyMessageProcessor.pushReplyMessage: (pushed, remark when not)."""
    sender = msg.properties.get(Prop.REPLY_TO_CLIENT)
    if sender is None:
        return False, f"reply message properties[{Prop.REPLY_TO_CLIENT}] is null"
    chan = server.clients.find_producer(sender)
    if chan is None:
        return False, f"push reply message fail, channel of <{sender}> not found."
    fields = cmd.ext_fields
    props = {**decode_properties(props_text), Prop.PUSH_REPLY_TIME: str(int(time.time() * 1000))}
    header = {
        "producerGroup": fields["producerGroup"],
        "topic": fields["topic"],
        "defaultTopic": fields["defaultTopic"],
        "defaultTopicQueueNums": fields["defaultTopicQueueNums"],
        "queueId": fields["queueId"],
        "sysFlag": fields["sysFlag"],
        "bornTimestamp": fields["bornTimestamp"],
        "flag": fields["flag"],
        "properties": encode_stored_properties(props),
        "unitMode": fields.get("unitMode", "false"),
        "bornHost": conn.peer,
        "storeHost": server.broker_addr,
        "storeTimestamp": str(int(time.time() * 1000)),
    }
    if "reconsumeTimes" in fields:
        header["reconsumeTimes"] = fields["reconsumeTimes"]
    failed = f"push reply message to {sender}fail."  # sic, RocketMQ's words
    try:
        answer = await chan.channel.invoke(
            RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, header, msg.body, CALL_CLIENT_TIMEOUT_S
        )
    except (asyncio.TimeoutError, ConnectionError, OSError) as exc:
        log.warning("push reply message to <%s> failed: %r", sender, exc)
        return False, failed
    if answer.code != ResponseCode.SUCCESS:
        log.warning("push reply message to <%s> refused: %s", sender, answer.remark)
        return False, failed
    return True, ""
