"""The requester's side of request-reply (the Java client's ``producer.request``).

A request carries a correlation id, this client's id and a time to live
(``Producer.request``); a consumer answers with ``create_reply(message, body)``; the
broker pushes that reply straight to this client's connection
(PUSH_REPLY_MESSAGE_TO_CLIENT), where ``deliver`` completes the waiting request. No
consumer group reads the reply topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from types import MappingProxyType

from idemp.message import Message
from idemp.remoting import MessageSysFlag, RemotingCommand, ResponseCode
from idemp.remoting.codes import Prop
from idemp.remoting.message import decode_properties

log = logging.getLogger("idemp.client.reply")


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
