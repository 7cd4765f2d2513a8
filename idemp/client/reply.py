"""Request-reply, as RocketMQ 4.x's Java client has it (``producer.request``).

The requester sends an ordinary message carrying a correlation id, its own client id
and a time to live; a consumer answers with ``create_reply(message, body)`` sent by any
producer; the broker pushes that reply straight to the requester's connection
(PUSH_REPLY_MESSAGE_TO_CLIENT), where it completes the waiting request. No consumer
group reads the reply topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from types import MappingProxyType

from idemp.message import Message
from idemp.remoting import MessageSysFlag, RemotingCommand, ResponseCode
from idemp.remoting.codes import REPLY_MESSAGE_FLAG, Prop
from idemp.remoting.message import decode_properties

from .producer import OutMessage

log = logging.getLogger("idemp.client.reply")


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


def is_reply(properties: dict[str, str]) -> bool:
    return properties.get(Prop.MSG_TYPE) == REPLY_MESSAGE_FLAG


def deliver(waiting: dict[str, asyncio.Future[Message]], cmd: RemotingCommand) -> RemotingCommand:
    """ClientRemotingProcessor.receiveReplyMessage: the pushed reply completes the request
    with its correlation id; one nobody waits for (timed out) is logged and answered all
    the same."""
    f = cmd.ext_fields
    props = decode_properties(f.get("properties", ""))
    props[Prop.REPLY_MESSAGE_ARRIVE_TIME] = str(int(time.time() * 1000))
    body = cmd.body
    if int(f.get("sysFlag", "0")) & MessageSysFlag.COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"reply body does not inflate: {exc}")
    keys = props.get(Prop.KEYS)
    reply = Message(
        topic=f.get("topic", ""),
        body=body,
        keys=tuple(k for k in keys.split(" ") if k) if keys else (),
        tags=props.get(Prop.TAGS),
        properties=MappingProxyType(props),
        msg_id=props.get(Prop.UNIQ_KEY, ""),
        queue_id=int(f.get("queueId", "-1")),
        reconsume_times=int(f.get("reconsumeTimes") or 0),
        born_timestamp=int(f.get("bornTimestamp", "0")),
        store_timestamp=int(f.get("storeTimestamp", "0")),
    )
    correlation = props.get(Prop.CORRELATION_ID, "")
    future = waiting.pop(correlation, None)
    if future is None or future.done():
        log.warning("reply %s matches no waiting request (timed out?)", correlation)
    else:
        future.set_result(reply)
    return cmd.response(ResponseCode.SUCCESS)
