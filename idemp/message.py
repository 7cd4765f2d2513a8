"""One message model for every client, and the listener result contract.

The official client's adapter, idemp's own runners and the tests all hand listeners
an ``idemp.Message``; a listener's return value is read with :func:`ack_of`, so a
runner never needs to know what produced it (a plain function, a decorated listener).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from idemp._fastinit import fast_frozen_init

_EMPTY: Mapping[str, str] = MappingProxyType({})


class ConsumeResult(Enum):
    """What a listener tells its runner: ack the message, or have it come back."""

    SUCCESS = "success"
    RECONSUME_LATER = "reconsume_later"
    #: Give up on the message: the runner sends it to the group's ``%DLQ%`` topic at once
    #: (RocketMQ's send-back with delay level -1), where an operator can see and replay
    #: it. Runners that cannot (the official client) reconsume it instead, and the broker
    #: dead-letters it after its maximum reconsume times.
    DEAD_LETTER = "dead_letter"


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    body: bytes
    keys: tuple[str, ...] = ()
    tags: str | None = None
    properties: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    msg_id: str = ""
    offset_msg_id: str | None = None
    queue_id: int = -1
    queue_offset: int = -1
    broker_name: str | None = None
    reconsume_times: int = 0
    born_timestamp: int = 0
    store_timestamp: int = 0
    consumer_group: str | None = None
    # RocketMQ 5 (gRPC clients): the FIFO message group, the delivery attempt (1 for the
    # first delivery; ``reconsume_times`` is one less), the receipt handle of this
    # delivery, and the delivery time a delayed message was sent with (epoch ms)
    message_group: str | None = None
    delivery_attempt: int | None = None
    receipt_handle: str | None = None
    delivery_timestamp: int | None = None

    @property
    def key(self) -> str | None:
        """The first message key (``KEYS`` is space-separated), or None."""
        return self.keys[0] if self.keys else None

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding)

    def json(self) -> Any:
        return json.loads(self.body)

    def property(self, name: str, default: str | None = None) -> str | None:
        return self.properties.get(name, default)


@dataclass(frozen=True, slots=True)
class ReconsumeLater:
    """``RECONSUME_LATER`` with when to try again: what a Java listener sets on its
    context (``delayLevelWhenNextConsume``, ``suspendCurrentQueueTimeMillis``).

    ``delay_level`` (1 and up: the broker's ``messageDelayLevel``, by default 1s 5s 10s
    30s 1m 2m …; a level past the last is the last): the concurrent runner's send-back
    asks for it instead of the broker's schedule (level 3 + reconsume times). ``after``
    (seconds): the orderly runner suspends the queue this long instead of its
    ``suspend_current_queue_time`` (kept within 10 ms..30 s, as Java does), and the
    RocketMQ 5 ``consume`` loop makes the message invisible this long. A runner that
    cannot choose (the official clients' push consumers) reads it as ``RECONSUME_LATER``.
    """

    delay_level: int = 0
    after: float | None = None

    def __post_init__(self) -> None:
        level, after = self.delay_level, self.after
        if not isinstance(level, int) or isinstance(level, bool) or level < 0:
            raise ValueError(
                f"ReconsumeLater(delay_level={level!r}): a delay level is 1 or more (0: the "
                "broker's schedule; ConsumeResult.DEAD_LETTER for the DLQ at once)"
            )
        if after is not None and not (isinstance(after, (int, float)) and after > 0):
            raise ValueError(f"ReconsumeLater(after={after!r}): seconds, more than 0")

    @property
    def consume_result(self) -> ConsumeResult:
        return ConsumeResult.RECONSUME_LATER


#: What a runner keeps of each message's result: an ack, a plain retry, a dead letter,
#: or a retry at a chosen time.
Answer = ConsumeResult | ReconsumeLater


def answer_of(result: object) -> Answer:
    """:func:`consume_result_of`, keeping the timing of a retry: a
    :class:`ReconsumeLater`, or a decorated listener's result whose ``retry`` is one (a
    guard's hold), is kept for the runner to honour."""
    if type(result) is ReconsumeLater:
        return result
    got = consume_result_of(result)
    if got is ConsumeResult.RECONSUME_LATER:
        retry = getattr(result, "retry", None)
        if type(retry) is ReconsumeLater:
            return retry
    return got


def consume_result_of(result: object) -> ConsumeResult:
    """How a runner reads a listener's return value.

    ``None``/``True``/``SUCCESS`` ack; ``False``/``RECONSUME_LATER`` (or a
    :class:`ReconsumeLater`) retry;
    ``DEAD_LETTER`` goes to the group's DLQ; an object with a ``consume_result``
    attribute (a decorated listener's outcome) is read through it. Raising is handled by
    the runner and always means retry.
    """
    if result is None or result is True:
        return ConsumeResult.SUCCESS
    if result is False:
        return ConsumeResult.RECONSUME_LATER
    if isinstance(result, ConsumeResult):
        return result
    inner = getattr(result, "consume_result", None)
    if isinstance(inner, ConsumeResult):
        return inner
    raise TypeError(f"a listener returned {result!r}; expected None, a bool or a ConsumeResult")


def ack_of(result: object) -> bool:
    """True when the listener's return value acks the message (see
    :func:`consume_result_of`); ``DEAD_LETTER`` is not an ack of the original."""
    return consume_result_of(result) is ConsumeResult.SUCCESS
