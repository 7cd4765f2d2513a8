"""Adapter for the official client (``rocketmq-client-python``, C++ inside): wrap a listener
for ``PushConsumer.subscribe`` (concurrent and orderly consumers alike).

The wheel acks a message whose callback raises (the exception escapes a ctypes callback,
which then returns 0 = CONSUME_SUCCESS), and it also acks after raising ValueError on any
return value that is not a ``ConsumeStatus``. So the callback built here catches every
exception itself (``BaseException`` too, except ``KeyboardInterrupt``/``SystemExit``) and
always returns a ``ConsumeStatus``: a listener's result is read with ``ack_of``.

    consumer = PushConsumer("orders")
    consumer.subscribe("Orders", callback(handle_order, group="orders"))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from idemp.message import Message, ack_of

logger = logging.getLogger("idemp.adapters.official")

#: System properties the wheel lets us read by name (it cannot list a message's
#: properties); user properties are read when named in ``properties=``.
SYSTEM_PROPERTIES = (
    "UNIQ_KEY",
    "RETRY_TOPIC",
    "REAL_TOPIC",
    "REAL_QID",
    "DELAY",
    "TRAN_MSG",
    "PGROUP",
)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def to_message(
    received: Any, *, group: str | None = None, properties: Iterable[str] = ()
) -> Message:
    """The wheel's ``RecvMessage`` as an ``idemp.Message``."""
    props: dict[str, str] = {}
    for name in (*SYSTEM_PROPERTIES, *properties):
        value = _text(received.get_property(name))
        if value:
            props[name] = value
    tags = _text(received.tags)
    return Message(
        topic=_text(received.topic),
        body=bytes(received.body or b""),
        keys=tuple(_text(received.keys).split()),
        tags=tags or None,
        properties=props,
        msg_id=_text(received.id),
        queue_id=int(received.queue_id),
        queue_offset=int(received.queue_offset),
        reconsume_times=int(received.reconsume_times),
        born_timestamp=int(received.born_timestamp),
        store_timestamp=int(received.store_timestamp),
        consumer_group=group,
    )


def callback(
    listener: Callable[[Message], Any],
    *,
    group: str,
    properties: Iterable[str] = (),
    on_error: Callable[[Message | None, BaseException], None] | None = None,
) -> Callable[[Any], Any]:
    """A ``PushConsumer.subscribe`` callback running ``listener(message)``.

    ``group`` is the consumer group (the wheel does not tell the callback); it sets
    ``Message.consumer_group`` and so the default dedup namespace. ``properties`` names
    the user properties to copy. Any exception → ``RECONSUME_LATER``, logged (and passed
    to ``on_error`` if given). The wheel cannot send a message to the DLQ itself: a
    ``DEAD_LETTER`` result (a guarded transition held ``max_holds`` times) is returned as
    ``RECONSUME_LATER``, and the broker dead-letters it once its reconsume times reach the
    group's maximum (16, the default ``max_holds``).
    """
    if not isinstance(group, str) or not group.strip():
        raise ValueError(
            f"callback(group={group!r}): pass the PushConsumer's consumer group; it names "
            "the dedup namespace of every message (the wheel does not tell the callback)"
        )
    from rocketmq.client import ConsumeStatus  # the optional dependency, at wrap time

    success, later = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER
    wanted = tuple(properties)

    def on_message(received: Any) -> Any:
        message: Message | None = None
        try:
            message = to_message(received, group=group, properties=wanted)
            return success if ack_of(listener(message)) else later
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: B036 - the wheel would ack it otherwise
            try:
                logger.error(
                    "listener failed, message will be reconsumed: msg_id=%s topic=%s",
                    message.msg_id if message else "?",
                    message.topic if message else "?",
                    exc_info=exc,
                )
                if on_error is not None:
                    on_error(message, exc)
            except BaseException:  # noqa: B036 - never let logging turn into an ack
                pass
            return later

    return on_message
