"""Recalling a delayed message (RecallMessage, RocketMQ 5.3): the handle a send returns
and the checks a recall passes, as RocketMQ 5.3.3 makes them.

The handle is RocketMQ's ``RecallMessageHandle.HandleV1``: URL-safe base64 of
``v1 <topic> <brokerName> <timestamp> <messageId>``, the timestamp being the message's
timer slot (its delivery time floored to the timer's 1 s precision, a whole second one
slot earlier) plus one. A recall parks a marker in the timer topic for that time; the
timer drops the message when it comes due (``idemp.broker.timer``, which owns the
marker's property and key). As in RocketMQ, a
recall checks neither that the message exists nor that it still waits: a well-formed
handle whose time is still ahead is recalled.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

TIMER_PRECISION_MS = 1000  # RocketMQ's timerPrecisionMs
TIMER_MAX_DELAY_MS = 3 * 24 * 3600 * 1000  # its timerMaxDelaySec
RECALL_TAG = "_RECALL_TAG_"
_JAVA_LONG = re.compile(r"[+-]?[0-9]+")
_FROM_URLSAFE = str.maketrans("-_", "+/")


@dataclass(frozen=True)
class RecallHandle:
    topic: str
    broker_name: str
    timestamp: str  # as written: a recall of a non-number fails on its time, not its form
    message_id: str


def timer_slot(deliver_ms: int) -> int:
    """The timer slot a delivery time goes to (HookUtils.transformTimerMessage)."""
    if deliver_ms % TIMER_PRECISION_MS == 0:
        return deliver_ms - TIMER_PRECISION_MS
    return deliver_ms // TIMER_PRECISION_MS * TIMER_PRECISION_MS


def build_handle(topic: str, broker_name: str, deliver_ms: int, message_id: str) -> str:
    raw = " ".join(("v1", topic, broker_name, str(timer_slot(deliver_ms) + 1), message_id))
    return base64.urlsafe_b64encode(raw.encode()).decode()


def parse_handle(text: str) -> RecallHandle | None:
    """None where RocketMQ's decodeHandle fails ("recall handle is invalid")."""
    if not text:
        return None
    try:
        padded = text + "=" * (-len(text) % 4)
        raw = base64.b64decode(padded.translate(_FROM_URLSAFE), validate=True)
    except (binascii.Error, ValueError):
        return None
    items = raw.decode("utf-8", "replace").split(" ")
    while items and not items[-1]:  # Java's split drops trailing empty strings
        items.pop()
    if len(items) < 5 or items[0] != "v1":
        return None
    return RecallHandle(items[1], items[2], items[3], items[4])


def refusal(handle: RecallHandle, topic: str, broker_name: str, now_ms: int) -> str | None:
    """RecallMessageProcessor's checks after the handle parsed, in its order and words."""
    if handle.topic != topic:
        return "recall failed, topic not match"
    if handle.broker_name != broker_name:
        return "recall failed, broker service not available"
    stamp = -1  # NumberUtils.toLong(text, -1)
    if _JAVA_LONG.fullmatch(handle.timestamp):
        value = int(handle.timestamp)
        if -(2**63) <= value < 2**63:
            stamp = value
    left = stamp - now_ms
    if left <= 0 or left >= TIMER_MAX_DELAY_MS:
        return "recall failed, timestamp invalid"
    return None
