"""Message traces, as the Java client's ``enableMsgTrace`` writes them, so that
``mqadmin queryMsgTraceById`` and RocketMQ Dashboard show idemp's producers and consumers.

A send adds a ``Pub`` record, a transaction's end (its producer's own, or its answer to a
check) an ``EndTransaction``; a consumed batch a ``SubBefore`` record per message, and a
``SubAfter`` per message once the listener answered (RocketMQ 4.9.7's
``TraceDataEncoder``: fields split by U+0001, records ended by U+0002). Records are
gathered for half a second, or until ~118 KB, and sent as one message to the trace topic
(``RMQ_SYS_TRACE_TOPIC`` by default), keyed by every traced message id and key: that is
how the query by message id finds them (``AsyncTraceDispatcher``). A trace that cannot be
sent is logged and dropped; it never holds up a send or a consume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from idemp.remoting import MessageExt, Prop, UniqKeyGenerator

log = logging.getLogger("idemp.client.trace")

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
_CONTENT = "\x01"
_FIELD = "\x02"
_FLUSH_AFTER_S = 0.5  # waitTimeThresholdMil
_MAX_BYTES = 128_000 - 10_000  # the trace producer's maxMessageSize, less its margin
# MessageType ordinals (an EndTransaction record always says Trans_msg_Commit)
NORMAL, TRANSACTION_HALF, TRANSACTION_COMMIT, DELAY = 0, 1, 2, 3
DEFAULT_REGION = "DefaultRegion"  # MixAll.DEFAULT_TRACE_REGION_ID
# ConsumeReturnType ordinals (the SubAfter's context code)
RETURN_SUCCESS, RETURN_FAILED = 0, 4


def _text(value: str | None) -> str:
    return "null" if value is None else value  # Java's StringBuilder.append(null)


def pub_record(
    *,
    timestamp_ms: int,
    region: str,
    group: str,
    topic: str,
    msg_id: str,
    tags: str | None,
    keys: str | None,
    store_host: str,
    body_length: int,
    cost_ms: int,
    msg_type: int,
    offset_msg_id: str,
    success: bool,
) -> str:
    fields = (
        "Pub",
        str(timestamp_ms),
        region,
        group,
        topic,
        msg_id,
        _text(tags),
        _text(keys),
        store_host,
        str(body_length),
        str(cost_ms),
        str(msg_type),
        offset_msg_id,
        "true" if success else "false",
    )
    return _CONTENT.join(fields) + _FIELD


def end_transaction_record(
    *,
    timestamp_ms: int,
    region: str | None,
    group: str,
    topic: str,
    msg_id: str,
    tags: str | None,
    keys: str | None,
    store_host: str,
    transaction_id: str,
    state: str,
    from_check: bool,
) -> str:
    """EndTransactionTraceHookImpl's record; ``state`` is Java's LocalTransactionState
    name, ``region`` the message's MSG_REGION property."""
    fields = (
        "EndTransaction",
        str(timestamp_ms),
        region or DEFAULT_REGION,
        group,
        topic,
        msg_id,
        _text(tags),
        _text(keys),
        store_host,
        str(TRANSACTION_COMMIT),
        transaction_id,
        state,
        "true" if from_check else "false",
    )
    return _CONTENT.join(fields) + _FIELD


def sub_before_records(
    timestamp_ms: int, region: str, group: str, request_id: str, msgs: Iterable[MessageExt]
) -> str:
    return "".join(
        _CONTENT.join(
            (
                "SubBefore",
                str(timestamp_ms),
                region,
                group,
                request_id,
                m.msg_id,
                str(m.reconsume_times),
                _text(m.properties.get(Prop.KEYS)),
            )
        )
        + _FIELD
        for m in msgs
    )


def sub_after_record(
    *,
    request_id: str,
    msg: MessageExt,
    cost_ms: int,
    success: bool,
    timestamp_ms: int,
    group: str,
) -> str:
    fields = (
        "SubAfter",
        request_id,
        msg.msg_id,
        str(cost_ms),
        "true" if success else "false",
        _text(msg.properties.get(Prop.KEYS)),
        str(RETURN_SUCCESS if success else RETURN_FAILED),
        str(timestamp_ms),
        group,
    )
    return _CONTENT.join(fields) + _FIELD


def trace_keys(msg_id: str, keys: str | None) -> list[str]:
    """What a record is found by: the message id and each of its keys."""
    return [msg_id, *(k for k in (keys or "").split(" ") if k)]


def traced(msg: MessageExt) -> bool:
    """A message its producer sent with tracing switched off is not traced."""
    return msg.properties.get(Prop.TRACE_ON) != "false"


Send = Callable[[str, bytes, list[str]], Awaitable[None]]  # topic, body, keys


class TraceDispatcher:
    """One per client instance and trace topic, on the instance's loop; ``send`` puts one
    message on the trace topic (the trace producer's)."""

    def __init__(self, topic: str, send: Send, client_ip: str) -> None:
        self.topic = topic
        self._send_message = send
        self._ids = UniqKeyGenerator(client_ip)
        self._records: list[str] = []
        self._keys: set[str] = set()
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Future[None]] = set()

    def request_id(self) -> str:
        return self._ids.next_id()

    def append(self, record: str, keys: Iterable[str]) -> None:
        self._records.append(record)
        self._keys.update(keys)
        self._size += len(record)
        if self._size >= _MAX_BYTES:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(_FLUSH_AFTER_S, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._records:
            return
        body, keys = "".join(self._records), sorted(self._keys)
        self._records, self._keys, self._size = [], set(), 0
        task = asyncio.ensure_future(self._send(body, keys))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def close(self, timeout: float = 3.0) -> None:
        """Send what is gathered and wait (bounded) for the sends in flight."""
        self.flush()
        if self._sending:
            await asyncio.wait(list(self._sending), timeout=timeout)

    async def _send(self, body: str, keys: list[str]) -> None:
        try:
            await self._send_message(self.topic, body.encode("utf-8"), keys)
        except Exception as exc:  # a trace must never hold up the traced
            log.warning("trace of %d bytes to %s not sent: %s", len(body), self.topic, exc)


class DeliveryTrace:
    """ConsumeMessageTraceHookImpl for one delivered batch: its SubBefore records when
    made, a SubAfter per message the listener answered (``done``)."""

    def __init__(self, dispatcher: TraceDispatcher, group: str, msgs: list[MessageExt]) -> None:
        self.dispatcher = dispatcher
        self.group = group
        self.msgs = msgs
        self.shown = [m for m in msgs if traced(m)]
        self.request_id = dispatcher.request_id()
        self.began = now_ms()
        if self.shown:
            region = _text(self.shown[-1].properties.get(Prop.MSG_REGION))
            keys = [k for m in self.shown for k in _keys_of(m)]
            record = sub_before_records(self.began, region, group, self.request_id, self.shown)
            dispatcher.append(record, keys)

    def done(self, successes: list[bool]) -> None:
        """``successes``: one per message tried, in order (fewer when some were not)."""
        if not self.shown:
            return
        ended = now_ms()
        cost = (ended - self.began) // len(self.msgs)
        for msg, success in zip(self.msgs, successes):
            if traced(msg):
                record = sub_after_record(
                    request_id=self.request_id,
                    msg=msg,
                    cost_ms=cost,
                    success=success,
                    timestamp_ms=ended,
                    group=self.group,
                )
                self.dispatcher.append(record, _keys_of(msg))


def _keys_of(msg: MessageExt) -> list[str]:
    return trace_keys(msg.msg_id, msg.properties.get(Prop.KEYS))


def now_ms() -> int:
    return int(time.time() * 1000)
