"""POP consumption for RocketMQ 5 clients: per-message invisibility instead of queue ownership.

A receive takes messages off a group's queues and makes them invisible for a while; each
comes with a receipt handle. An ack ends it; a message still unacked when its invisible
time runs out is handed out again with its delivery attempt raised. This follows RocketMQ
5.3.3's broker (``PopMessageProcessor``, ``PopReviveService``, ``ConsumerOrderInfoManager``):

- normal groups: a receive moves the group's offset at once (the offset mqadmin shows);
  an expired message is revived into the retry topic ``%RETRY%<group>_<topic>`` with its
  reconsume times + 1 (RocketMQ's POP retry topic, V1 naming) and received from there,
  under its own topic name again;
- FIFO groups (``consumeMessageOrderly``): a queue with unacked messages delivers nothing
  else to that group until they are acked; an expired one comes back from its own queue,
  first, after exactly its invisible time (RocketMQ blocks per queue, and a message group
  always lands in one queue, so a group waits for its own previous message);
- a message received for the ``max_attempts``-th time plus one goes to ``%DLQ%<group>``
  instead of being delivered (the proxy's ``PopMessageResultFilterImpl``).

The state is kept in memory and written to a journal as it changes (``popjournal``;
RocketMQ keeps it in its revive topic): after a restart an unacked message stays
invisible until its time ends and comes back as the next attempt, and a handle from
before the restart still acks or changes its message. Everything runs on the broker's
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from idemp.remoting.codes import Prop, pop_retry_topic
from idemp.remoting.javaparse import parse_java_int
from idemp.remoting.message import MessageExt, decode_message
from idemp.waiting import within

from ..diskguard import DiskFull
from ..metadata import Perm, dlq_topic, retry_topic
from ..send import send_back_properties
from ..store import MessageStore
from .deadlines import Deadlines
from .popjournal import PopJournal, Record

NORMAL_TOPIC = "0"
# the proxy's renewMaxTimeMillis (3 h): past it, even an auto-renewed message comes back
MAX_RENEW_MS = 3 * 3600 * 1000
# the proxy's invisibleTimeMillisWhenClear: a departed client's messages return after 1 s
CLEAR_MS = 1000
# the proxy's renewAheadTimeMillis and the slice it renews by (defaultInvisibleTimeMills)
RENEW_AHEAD_MS = 10_000
RENEW_SLICE_MS = 60_000
RETRY_TOPIC = "1"


class HandleError(Exception):
    """A receipt handle that cannot be used: the proxy answers INVALID_RECEIPT_HANDLE."""


# the proxy's ProxyException, whose toString the gRPC status carries (GrpcProxyException)
_PROXY_EXCEPTION = "org.apache.rocketmq.proxy.common.ProxyException: "
EXPIRED = _PROXY_EXCEPTION + "receipt handle is expired"


class OffsetOutside(Exception):
    """The handle's queue offset is not in the queue the request names: the broker's ack
    or change answers NO_MESSAGE, which the proxy calls an abnormal status."""


class MalformedHandle(HandleError):
    """Not a receipt handle at all: RocketMQ 5.3.3's proxy fails to parse it and answers
    INTERNAL_SERVER_ERROR ("Parse failed, dataList size N"); idemp gives the same code."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """A receipt handle, in RocketMQ's text form (``ReceiptHandle.encode``): start offset,
    pop time, invisible time, revive queue, topic type, broker, queue, offset, log offset."""

    start_offset: int
    pop_time: int
    invisible_ms: int
    topic_type: str
    broker: str
    queue_id: int
    offset: int
    commit_log_offset: int

    def encode(self) -> str:
        return (
            f"{self.start_offset} {self.pop_time} {self.invisible_ms} 0 {self.topic_type} "
            f"{self.broker} {self.queue_id} {self.offset} {self.commit_log_offset}"
        )

    @property
    def visible_at(self) -> int:
        return self.pop_time + self.invisible_ms

    @classmethod
    def decode(cls, text: str) -> Receipt:
        """ReceiptHandle.decode: Java's split (trailing empty fields dropped), then each
        number parsed in turn; what it throws is the answer, in the proxy's words."""
        parts = _java_split(text)
        if len(parts) < 8:
            raise MalformedHandle(
                f"Parse failed, dataList size {len(parts)}. IllegalArgumentException. "
                "org.apache.rocketmq.common.consumer.ReceiptHandle.decode(ReceiptHandle.java:56)"
            )
        bits = {0: 64, 1: 64, 2: 64, 3: 32, 6: 32, 7: 64, 8: 64}
        numbers: dict[int, int] = {}
        for index, size in bits.items():
            if index < len(parts):
                value = parse_java_int(parts[index], size)
                if value is None:
                    raise MalformedHandle(
                        f'For input string: "{parts[index]}". NumberFormatException. '
                        "java.base/java.lang.NumberFormatException.forInputString"
                        "(NumberFormatException.java:67)"
                    )
                numbers[index] = value
        return cls(
            numbers[0],
            numbers[1],
            numbers[2],
            parts[4],
            parts[5],
            numbers[6],
            numbers[7],
            numbers.get(8, -1),
        )


def _java_split(text: str) -> list[str]:
    """String.split(" "): trailing empty strings dropped, but "" is one empty field."""
    if not text:
        return [""]
    parts = text.split(" ")
    while parts and not parts[-1]:
        parts.pop()
    return parts


@dataclass(slots=True)
class _InFlight:
    receipt: Receipt
    reconsume: int  # reconsume times of this delivery (attempt - 1)
    # when it becomes visible again: the receipt's time, moved on by auto-renewal
    deadline: int = 0
    # PushConsumers receive with auto_renew: the server keeps the message invisible for
    # as long as their client is connected (the proxy's receipt handle manager), up to
    # renew_until; the client keeps acking with the handle it was given
    client: str | None = None
    renew_until: int = 0

    def __post_init__(self) -> None:
        if not self.deadline:
            self.deadline = self.receipt.visible_at


@dataclass(slots=True)
class _Ordered:
    """A FIFO group's progress on one queue."""

    start: int  # the first offset not yet acked
    committed: int | None = None  # the offset this service last committed for the queue
    inflight: dict[int, _InFlight] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    extra: dict[int, int] = field(default_factory=dict)  # offset -> deliveries that expired


@dataclass(slots=True)
class Popped:
    message: MessageExt  # under the topic the client subscribed to
    receipt: Receipt
    attempt: int


@dataclass(slots=True)
class _GroupTopic:
    next: dict[tuple[str, int], int] = field(default_factory=dict)  # (stored topic, qid)
    inflight: dict[tuple[str, int, int], _InFlight] = field(default_factory=dict)
    # each queue's offsets in ``inflight``, in the order popped (ascending, as a queue is
    # read forward): its first is the lowest, so the committed offset is found without a
    # scan of everything in flight (an ack at a queue's head cost O(in flight) before)
    pending: dict[tuple[str, int], dict[int, None]] = field(default_factory=dict)
    ordered: dict[int, _Ordered] = field(default_factory=dict)
    # the offset this service last committed per queue: another one in the table (an
    # admin's reset, a group deleted with its offsets) moves the next pop there
    committed: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Due:
    """Where a message in flight is held, for the deadline sweeps."""

    group_topic: tuple[str, str]
    state: _GroupTopic
    key: tuple[str, int, int]  # (stored topic, queue, offset)
    held: _InFlight
    order: _Ordered | None  # a FIFO queue's, else None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _journaled(
    method: Callable[Concatenate[PopService, _P], _R],
) -> Callable[Concatenate[PopService, _P], _R]:
    """A request's changes reach the journal when it is done, before its answer leaves."""

    @functools.wraps(method)
    def run(self: PopService, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        finally:
            self._sync()

    return run


def _fields(held: _InFlight) -> list[Any]:
    """What the journal keeps of a message in flight (its receipt, attempt and time)."""
    r = held.receipt
    return [
        r.start_offset,
        r.pop_time,
        r.invisible_ms,
        r.topic_type,
        r.commit_log_offset,
        held.reconsume,
        held.deadline,
    ]


class PopService:
    def __init__(
        self,
        store: MessageStore,
        broker_name: str,
        retry_first_percent: Callable[[], int] = lambda: 20,
        *,
        journal: Path | None = None,
    ) -> None:
        """``journal``: the file the state is kept in across restarts (None: memory only)."""
        self.store = store
        self.broker_name = broker_name
        # PopMessageProcessor: popFromRetryProbability, read at every pop
        self.retry_first_percent = retry_first_percent
        self._random = random.Random()
        self._state: dict[tuple[str, str], _GroupTopic] = {}
        # what falls due when (revive), and what a connected client keeps invisible (renew)
        self._due: Deadlines[_Due] = Deadlines(self._holds)
        self._renewing: Deadlines[_Due] = Deadlines(self._renews)
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self.dead_lettered = 0
        store.listeners.append(self._arrived)
        self._journal = PopJournal(journal) if journal is not None else None
        if self._journal is not None:
            self._restore(self._journal.load())
            self._journal.rewrite(self._records())

    # --- waiting for messages ---------------------------------------------------------
    def _arrived(self, topic: str, queue_id: int, max_offset: int, tags_code: int) -> None:
        # A held receive waits on its own topic. A message revived into the retry topic
        # wakes nobody: RocketMQ 5.3.3's PopLongPollingService notifies the waiters of
        # the topic written, and a receive registers its topic, not the retry topic
        # (%RETRY%<group>_<topic>, the V1 name), so the retry is found by the next pop
        # or when the held one's poll time ends (a PushConsumer's: 20 s, measured).
        self.wake(topic)

    def wake(self, topic: str) -> None:
        for fut in self._waiters.pop(topic, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(self, topic: str, timeout: float) -> None:
        """Until a message arrives on ``topic`` (not its retries, see ``_arrived``), a FIFO
        queue is free again, or ``timeout`` seconds pass."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(topic, set()).add(fut)
        try:
            # not asyncio.wait_for: a receive cancelled as a message arrived polled on
            await within(fut, timeout)
        except TimeoutError:
            pass
        finally:
            waiting = self._waiters.get(topic)
            if waiting is not None:
                waiting.discard(fut)

    # --- the deadline index ------------------------------------------------------------
    def _holds(self, deadline: int, due: _Due) -> bool:
        held = due.held
        if held.deadline != deadline or self._state.get(due.group_topic) is not due.state:
            return False
        if due.order is not None:
            return due.order.inflight.get(due.key[2]) is held
        return due.state.inflight.get(due.key) is held

    def _renews(self, deadline: int, due: _Due) -> bool:
        return due.held.client is not None and self._holds(deadline, due)

    def _track(self, due: _Due) -> None:
        """``due.held`` got a deadline (popped, renewed, released, changed)."""
        self._due.push(due.held.deadline, due)
        if due.held.client is not None:
            self._renewing.push(due.held.deadline, due)

    # --- receive ----------------------------------------------------------------------
    @_journaled
    def pop(
        self,
        group: str,
        topic: str,
        batch: int,
        invisible_ms: int,
        *,
        fifo: bool,
        accepts: Callable[[MessageExt], bool],
        max_attempts: int,
        renew_for: str | None = None,
    ) -> list[Popped]:
        """``renew_for``: the client id of an auto-renewing receive (a PushConsumer)."""
        now = int(time.time() * 1000)
        state = self._state.setdefault((group, topic), _GroupTopic())
        cfg = self.store.topics.get(topic)
        if cfg is None:
            return []
        out: list[Popped] = []
        retry = pop_retry_topic(group, topic)
        has_retry = not fifo and self.store.topics.get(retry) is not None
        # PopMessageProcessor's one draw: it decides whether the retry topic goes first,
        # and which queue the read starts at (so that no queue is always read last)
        random_q = self._random.randrange(100)
        retry_first = random_q < self.retry_first_percent()

        def pop_retry() -> None:
            if has_retry and len(out) < batch:
                self._pop_queue(
                    group,
                    topic,
                    retry,
                    0,
                    state,
                    batch,
                    invisible_ms,
                    now,
                    out,
                    accepts,
                    max_attempts,
                )

        if retry_first:
            pop_retry()
        queues = cfg.readQueueNums
        for i in range(queues):
            if len(out) >= batch:
                break
            qid = (random_q + i) % queues
            if fifo:
                self._pop_ordered(
                    group, topic, qid, state, batch, invisible_ms, now, out, accepts, max_attempts
                )
            else:
                self._pop_queue(
                    group,
                    topic,
                    topic,
                    qid,
                    state,
                    batch,
                    invisible_ms,
                    now,
                    out,
                    accepts,
                    max_attempts,
                )
        if not retry_first:  # the retry topic fills what the queues left
            pop_retry()
        if renew_for is not None:
            self._renewed(group, topic, out, renew_for, now)
        return out

    def _renewed(self, group: str, topic: str, popped: list[Popped], client: str, now: int) -> None:
        for item in popped:
            found = self._find(group, topic, item.receipt)
            if found is not None:
                found.held.client = client
                found.held.renew_until = now + MAX_RENEW_MS
                self._renewing.push(found.held.deadline, found)

    def _start_offset(self, group: str, stored: str, qid: int) -> int:
        committed = self.store.offsets.query(group, stored, qid)
        if committed is not None and committed >= 0:
            return max(committed, self.store.min_offset(stored, qid))
        # ConsumeInitMode.MAX, except that a queue still holding its first message starts
        # at it (RocketMQ's initPopOffsetByCheckMsgInMem): a new group sees what is there.
        low = self.store.min_offset(stored, qid)
        return low if low == 0 else self.store.max_offset(stored, qid)

    def _pop_queue(
        self,
        group: str,
        topic: str,
        stored: str,
        qid: int,
        state: _GroupTopic,
        batch: int,
        invisible_ms: int,
        now: int,
        out: list[Popped],
        accepts: Callable[[MessageExt], bool],
        max_attempts: int,
    ) -> None:
        key = (stored, qid)
        offset = state.next.get(key)
        if offset is None or self._moved(group, stored, qid, state.committed.get(key)):
            # RocketMQ's pop reads the group's committed offset every time: one set
            # by someone else counts from there
            offset = self._start_offset(group, stored, qid)
        start = offset
        end = self.store.max_offset(stored, qid)
        topic_type = RETRY_TOPIC if stored != topic else NORMAL_TOPIC
        pending = state.pending.setdefault(key, {})
        while len(out) < batch and offset < end:
            # what the batch still lacks in one read (one message a read cost ~5 % of a
            # receive); a record filtered out below leaves room for the next read
            result = self.store.get_messages(stored, qid, offset, batch - len(out), None)
            if not result.records:
                if result.next_begin_offset <= offset:
                    break
                offset = result.next_begin_offset
                continue
            for record in result.records:
                msg, _ = decode_message(record, 0, decompress=False)
                offset = msg.queue_offset + 1
                if not accepts(msg):
                    continue
                if msg.reconsume_times >= max_attempts:
                    self._to_dlq(group, topic, msg)
                    continue
                receipt = self._receipt(start, now, invisible_ms, topic_type, qid, msg)
                at = (stored, qid, msg.queue_offset)
                held = state.inflight[at] = _InFlight(receipt, msg.reconsume_times)
                self._due.push(held.deadline, _Due((group, topic), state, at, held, None))
                self._note(group, topic, at, held)
                pending[msg.queue_offset] = None
                msg.topic = topic
                out.append(Popped(msg, receipt, msg.reconsume_times + 1))
        state.next[key] = offset
        if offset != start:
            self._commit(group, topic, state, stored, qid)
            if self._journal is not None:  # the committed offset follows from it on restore
                self._journal.add(["q", group, topic, stored, qid, offset])

    def _receipt(
        self, start: int, now: int, invisible_ms: int, topic_type: str, qid: int, msg: MessageExt
    ) -> Receipt:
        return Receipt(
            start,
            now,
            invisible_ms,
            topic_type,
            self.broker_name,
            qid,
            msg.queue_offset,
            msg.commit_log_offset,
        )

    def _settle(self, due: _Due) -> _InFlight:
        """``due``'s message leaves the in-flight set (acked, or revived), and the
        committed offset moves if it was the one holding it back."""
        state, key = due.state, due.key
        stored, qid, offset = key
        queue = state.pending.get((stored, qid))
        if queue is not None:
            queue.pop(offset, None)
        held = state.inflight.pop(key)
        group, topic = due.group_topic
        if self._journal is not None:
            self._journal.settled(group, topic, *key)
        if self.store.offsets.query(group, stored, qid) == offset:
            self._commit(group, topic, state, stored, qid)
        return held

    def _commit(self, group: str, topic: str, state: _GroupTopic, stored: str, qid: int) -> None:
        """The group's offset on a queue: up to its first message still invisible (RocketMQ
        keeps checkpoints in its revive topic instead): what is in flight is never behind
        the offset, so a lost journal loses no message."""
        nxt = state.next.get((stored, qid))
        if nxt is None:
            return
        lowest = next(iter(state.pending.get((stored, qid), ())), nxt)
        committed = state.committed[(stored, qid)] = min(nxt, lowest)
        self.store.offsets.commit(group, stored, qid, committed)

    def _moved(self, group: str, stored: str, qid: int, committed: int | None) -> bool:
        """Whether the group's offset on the queue is no longer the one this service
        committed last (None: it committed none yet)."""
        return committed is not None and self.store.offsets.query(group, stored, qid) != committed

    def _pop_ordered(
        self,
        group: str,
        topic: str,
        qid: int,
        state: _GroupTopic,
        batch: int,
        invisible_ms: int,
        now: int,
        out: list[Popped],
        accepts: Callable[[MessageExt], bool],
        max_attempts: int,
    ) -> None:
        order = state.ordered.get(qid)
        if order is None or (
            not order.inflight and self._moved(group, topic, qid, order.committed)
        ):
            order = state.ordered[qid] = _Ordered(self._start_offset(group, topic, qid))
        if order.inflight:
            if any(f.deadline > now for f in order.inflight.values()):
                return  # the queue's previous messages are still being consumed
            # RocketMQ 5.3.3 reads the queue again from its committed offset, the first
            # message not acked, and skips nothing after it: what was acked after it in
            # that delivery (other message groups' messages) is delivered again, and
            # counts as handed out once more, as the unacked ones do
            for offset in (*order.inflight, *order.acked):
                order.extra[offset] = order.extra.get(offset, 0) + 1
            order.inflight.clear()
            order.acked.clear()
            self._note_order(group, topic, qid, order)
        offset = order.start
        start = offset
        end = self.store.max_offset(topic, qid)
        found: list[MessageExt] = []
        while len(out) + len(found) < batch and offset < end:
            if offset in order.acked:
                offset += 1
                continue
            want = batch - len(out) - len(found)
            result = self.store.get_messages(topic, qid, offset, want, None)
            if not result.records:
                nxt = result.next_begin_offset
                if nxt <= offset:
                    break
                self._ack_ordered(group, topic, qid, order, range(offset, nxt))
                offset = nxt
                continue
            for record in result.records:
                msg, _ = decode_message(record, 0, decompress=False)
                offset = msg.queue_offset + 1
                if msg.queue_offset in order.acked:
                    continue
                if not accepts(msg):
                    self._ack_ordered(group, topic, qid, order, [msg.queue_offset])
                    continue
                found.append(msg)
        # RocketMQ reports one count per queue for a FIFO receive: the fewest times any
        # of its messages was handed out before (ConsumerOrderInfoManager.update), so a
        # batch holding a first delivery is attempt 1 throughout
        count = min((order.extra.get(m.queue_offset, 0) for m in found), default=0)
        for msg in found:
            reconsume = count if count > 0 else msg.reconsume_times
            msg.reconsume_times = reconsume
            if reconsume >= max_attempts:
                self._to_dlq(group, topic, msg)
                self._ack_ordered(group, topic, qid, order, [msg.queue_offset])
                continue
            receipt = self._receipt(start, now, invisible_ms, NORMAL_TOPIC, qid, msg)
            held = order.inflight[msg.queue_offset] = _InFlight(receipt, reconsume)
            at = (topic, qid, msg.queue_offset)
            self._due.push(held.deadline, _Due((group, topic), state, at, held, order))
            out.append(Popped(msg, receipt, reconsume + 1))
        if found:
            self._note_order(group, topic, qid, order)

    def _ack_ordered(
        self, group: str, topic: str, qid: int, order: _Ordered, offsets: object
    ) -> None:
        for offset in offsets:  # type: ignore[attr-defined]
            order.inflight.pop(offset, None)
            order.acked.add(offset)
        moved = order.start
        while order.start in order.acked:
            order.acked.discard(order.start)
            order.extra.pop(order.start, None)  # committed: never read again
            order.start += 1
        if order.start != moved:
            order.committed = order.start
            self.store.offsets.commit(group, topic, qid, order.start)
        self._note_order(group, topic, qid, order)

    # --- ack, change, dead letter -----------------------------------------------------
    def _find(self, group: str, topic: str, receipt: Receipt) -> _Due | None:
        """Where the delivery ``receipt`` stands for is held; None when its message is not
        invisible (acked already, or never received) or is invisible under another handle
        (one a ChangeInvisibleDuration replaced). RocketMQ 5.3.3 takes such a handle until
        its own time runs out, and its ack or change leaves the newer delivery standing:
        the message comes back at that one's time (measured)."""
        state = self._state.get((group, topic))
        if state is None:
            return None
        stored = pop_retry_topic(group, topic) if receipt.topic_type == RETRY_TOPIC else topic
        key = (stored, receipt.queue_id, receipt.offset)
        order = state.ordered.get(receipt.queue_id) if stored == topic else None
        held: _InFlight | None
        if order is not None and receipt.offset in order.inflight:
            held = order.inflight[receipt.offset]
        else:
            order, held = None, state.inflight.get(key)
        if held is None:
            return None
        if held.receipt != receipt:
            return None
        return _Due((group, topic), state, key, held, order)

    def _check(self, group: str, topic: str, text: str) -> tuple[Receipt, _Due | None]:
        """The handle decoded and the delivery it stands for; HandleError when it is
        malformed, void, or its message is visible again (renewal counts)."""
        receipt = Receipt.decode(text)
        found = self._find(group, topic, receipt)
        deadline = found.held.deadline if found is not None else receipt.visible_at
        if deadline <= int(time.time() * 1000):
            raise HandleError(EXPIRED)
        return receipt, found

    @staticmethod
    def check_handle(text: str) -> Receipt:
        """What the proxy checks of a handle before the broker sees it (parsed, not
        expired): all that is checked when the request names a topic the broker lacks."""
        receipt = Receipt.decode(text)
        if receipt.visible_at <= int(time.time() * 1000):
            raise HandleError(EXPIRED)
        return receipt

    def _outside(self, group: str, topic: str, receipt: Receipt, *, last_included: bool) -> None:
        """AckMessageProcessor (offset below the queue's min or above its max) and
        ChangeInvisibleTimeProcessor (at its max too): NO_MESSAGE."""
        stored = pop_retry_topic(group, topic) if receipt.topic_type == RETRY_TOPIC else topic
        cq = self.store.find_queue(stored, receipt.queue_id)
        low, high = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
        if (
            receipt.offset < low
            or receipt.offset > high
            or (receipt.offset == high and not last_included)
        ):
            raise OffsetOutside()

    @_journaled
    def ack(self, group: str, topic: str, handle: str) -> None:
        """Raises HandleError for an expired or malformed handle, OffsetOutside when the
        topic's queue has no such offset; acking a message that is already acked (or was
        never received) is accepted, as RocketMQ's ack is."""
        receipt, found = self._check(group, topic, handle)
        self._outside(group, topic, receipt, last_included=True)
        if found is None:
            return
        if found.order is not None:
            self._ack_ordered(group, topic, receipt.queue_id, found.order, [receipt.offset])
            self.wake(topic)
        else:
            self._settle(found)

    @_journaled
    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> Receipt:
        """A new handle, invisible for ``invisible_ms`` from now; the old one is void. The
        delivery attempt stays: what comes back after it is the next attempt. An explicit
        invisible duration ends auto-renewal."""
        receipt, found = self._check(group, topic, handle)
        self._outside(group, topic, receipt, last_included=False)
        now = int(time.time() * 1000)
        fresh = dataclasses.replace(receipt, pop_time=now, invisible_ms=invisible_ms)
        if found is None:
            return fresh
        replaced = _InFlight(fresh, found.held.reconsume)
        if found.order is not None:
            found.order.inflight[receipt.offset] = replaced
        else:
            found.state.inflight[found.key] = replaced
        found.held = replaced
        self._due.push(replaced.deadline, found)
        self._note_held(found)
        return fresh

    @_journaled
    def forward_to_dlq(self, group: str, topic: str, handle: str) -> None:
        """ProducerProcessor.forwardMessageToDeadLetterQueue: no expiry check, only a
        commit log offset in the handle; the message sent back, then acked, an ack whose
        failure (an expired handle) nobody hears."""
        receipt = Receipt.decode(handle)
        if receipt.commit_log_offset < 0:
            raise HandleError(_PROXY_EXCEPTION + "commit log offset is empty")
        msg = self.store.lookup(receipt.commit_log_offset)
        if msg is None:
            raise HandleError("receipt handle is invalid")
        if self.store.disk.full:  # the message stays in flight and comes back
            raise DiskFull()
        self._to_dlq(group, topic, msg)
        with contextlib.suppress(HandleError, OffsetOutside):
            self.ack(group, topic, handle)

    def _to_dlq(self, group: str, topic: str, msg: MessageExt) -> None:
        store = self.store
        # the broker's send-back creates the group's (4.x) retry topic before it decides
        # on the dead-letter queue, so it exists after a message went there (as on 5.3.3)
        gcfg = store.groups.find_or_create(group)
        retry_queues = gcfg.retryQueueNums if gcfg is not None else 1
        store.topics.create_system(retry_topic(group), retry_queues, Perm.READ | Perm.WRITE)
        dlq = store.topics.create_system(dlq_topic(group), 1, Perm.READ | Perm.WRITE)
        # the proxy sends it back (delay level -1) as a 4.x consumer would: RETRY_TOPIC is
        # the topic of the copy as stored (the POP retry topic for a retried message),
        # ORIGIN_MESSAGE_ID its offset id, DELAY 0, one more reconsume (measured on 5.3.3)
        props = send_back_properties(msg, 0)
        store.put(
            MessageExt(
                topic=dlq.topicName,
                queue_id=0,
                body=msg.body,
                flag=msg.flag,
                properties=props,
                sys_flag=msg.sys_flag,
                born_timestamp=msg.born_timestamp,
                born_host=msg.born_host,
                reconsume_times=msg.reconsume_times + 1,
            ),
            keep_wait=True,
            apply_delay=False,
        )
        self.dead_lettered += 1

    # --- revive -----------------------------------------------------------------------
    def _all_inflight(self) -> Iterator[_Due]:
        for group_topic, state in self._state.items():
            for key, held in state.inflight.items():
                yield _Due(group_topic, state, key, held, None)
            for qid, order in state.ordered.items():
                for offset, held in order.inflight.items():
                    yield _Due(group_topic, state, (group_topic[1], qid, offset), held, order)

    def pending(self) -> bool:
        """Whether any received message still has a deadline to keep (revive, renew)."""
        return len(self._due) > 0

    @_journaled
    def renew(self, alive: Callable[[str], bool]) -> int:
        """Keep auto-renewed messages invisible while their client is connected: due
        within RENEW_AHEAD_MS, they get RENEW_SLICE_MS more (the proxy's renew task)."""
        now = int(time.time() * 1000)
        renewed = 0
        for deadline, due in self._renewing.pop_due(now + RENEW_AHEAD_MS):
            if not self._renews(deadline, due):
                continue  # listed twice under one deadline, and renewed already
            held = due.held
            if now < held.renew_until and alive(held.client):  # type: ignore[arg-type]
                held.deadline = min(now + RENEW_SLICE_MS, held.renew_until)
                self._track(due)
                self._note_held(due)
                renewed += 1
            else:
                held.client = None  # its entry in ``_due`` stands: revive takes it
        return renewed

    @_journaled
    def release(self, group: str, topic: str, receipts: list[Receipt]) -> None:
        """Popped but never handed over: visible again now (the next revive or FIFO
        receive takes them), with this delivery not counted."""
        now = int(time.time() * 1000)
        for receipt in receipts:
            due = self._find(group, topic, receipt)
            if due is not None:
                due.held.client = None
                due.held.deadline = now
                if due.order is None:
                    due.held.reconsume -= 1  # revive adds one: this delivery never happened
                self._track(due)
                self._note_held(due)

    @_journaled
    def release_client(self, client: str) -> None:
        """A client left: its auto-renewed messages come back shortly (the proxy changes
        their invisible time to invisibleTimeMillisWhenClear)."""
        now = int(time.time() * 1000)
        for due in list(self._all_inflight()):
            if due.held.client == client:
                due.held.client = None
                due.held.deadline = min(due.held.deadline, now + CLEAR_MS)
                self._track(due)
                self._note_held(due)

    @_journaled
    def revive(self) -> int:
        """Hand out again what stayed invisible too long: normal groups through their
        retry topic, FIFO queues from where they stand. Returns how many were revived."""
        now = int(time.time() * 1000)
        revived = 0
        for deadline, due in self._due.pop_due(now):
            if not self._holds(deadline, due):
                continue  # listed twice under one deadline, and revived already
            group, topic = due.group_topic
            if due.order is not None:
                if all(f.deadline <= now for f in due.order.inflight.values()):
                    self.wake(topic)  # the queue is free again: a waiting receive takes it
                continue
            msg = self.store.lookup(due.held.receipt.commit_log_offset)
            if msg is not None:
                self._to_retry(group, topic, msg, due.held.reconsume + 1, now)
                revived += 1
            self._settle(due)
        return revived

    def _to_retry(self, group: str, topic: str, msg: MessageExt, reconsume: int, now: int) -> None:
        retry = pop_retry_topic(group, topic)
        cfg = self.store.topics.create_system(retry, 1, Perm.READ | Perm.WRITE)
        props = dict(msg.properties)  # no RETRY_TOPIC: RocketMQ 5.3.3 writes none here
        props.setdefault(Prop.FIRST_POP_TIME, str(now))
        props.pop(Prop.DELAY, None)
        props[Prop.WAIT] = "false"
        self.store.put(
            MessageExt(
                topic=cfg.topicName,
                queue_id=0,
                body=msg.body,
                flag=msg.flag,
                properties=props,
                sys_flag=msg.sys_flag,
                born_timestamp=msg.born_timestamp,
                born_host=msg.born_host,
                reconsume_times=reconsume,
            ),
            keep_wait=True,
            apply_delay=False,
        )

    @_journaled
    def forget_group(self, group: str) -> None:
        for key in [k for k in self._state if k[0] == group]:
            del self._state[key]
        if self._journal is not None:
            self._journal.add(["g", group])

    # --- the journal ------------------------------------------------------------------
    def _note(self, group: str, topic: str, key: tuple[str, int, int], held: _InFlight) -> None:
        if self._journal is not None:
            self._journal.in_flight(group, topic, *key, _fields(held))

    def _note_order(self, group: str, topic: str, qid: int, order: _Ordered) -> None:
        if self._journal is not None:
            self._journal.add(self._order_record(group, topic, qid, order))

    def _note_held(self, due: _Due) -> None:
        """``due``'s delivery changed (its time, its handle)."""
        group, topic = due.group_topic
        if due.order is not None:
            self._note_order(group, topic, due.key[1], due.order)
        else:
            self._note(group, topic, due.key, due.held)

    @staticmethod
    def _order_record(group: str, topic: str, qid: int, order: _Ordered) -> Record:
        inflight = [[offset, *_fields(held)] for offset, held in order.inflight.items()]
        extra = [[offset, n] for offset, n in order.extra.items()]
        return ["o", group, topic, qid, order.start, order.committed, inflight,
                sorted(order.acked), extra]  # fmt: skip

    def _sync(self) -> None:
        journal = self._journal
        if journal is None:
            return
        journal.flush()
        if journal.due_for_rewrite():
            records = list(self._records())
            if journal.lines > 4 * len(records):
                journal.rewrite(records)
            else:
                journal.postpone()

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    def _records(self) -> Iterator[Record]:
        """The state as journal records: what a rewritten journal holds."""
        for (group, topic), state in self._state.items():
            for (stored, qid), nxt in state.next.items():
                yield ["q", group, topic, stored, qid, nxt]
            for key, held in state.inflight.items():
                yield ["e", group, topic, *key, *_fields(held)]
            for qid, order in state.ordered.items():
                yield self._order_record(group, topic, qid, order)

    def _held(self, qid: int, offset: int, fields: list[Any]) -> _InFlight:
        start, pop_time, invisible, topic_type, log_offset, reconsume, deadline = fields
        receipt = Receipt(
            start, pop_time, invisible, topic_type, self.broker_name, qid, offset, log_offset
        )
        # the proxy's renewal of a PushConsumer's messages does not outlive it: each
        # comes back at the time it had last
        return _InFlight(receipt, reconsume, deadline)

    def _restore(self, records: list[Record]) -> None:
        """The state a journal left, as it was before the restart; the offset table is
        saved every few seconds, so after a crash it may lag behind: the journal's
        committed offsets are the later ones."""
        entries: list[tuple[tuple[str, str], tuple[str, int, int], list[Any]]] = []
        for record in records:
            kind, group, topic = record[0], record[1], record[2]
            state = self._state.setdefault((group, topic), _GroupTopic())
            if kind == "q":
                stored, qid, nxt = record[3:6]
                state.next[(stored, qid)] = nxt
            elif kind == "e":
                entries.append(((group, topic), (record[3], record[4], record[5]), record[6:]))
            elif kind == "o":
                qid, start, committed, inflight, acked, extra = record[3:9]
                order = state.ordered[qid] = _Ordered(start, committed)
                order.acked = set(acked)
                order.extra = {offset: n for offset, n in extra}
                for offset, *fields in inflight:
                    held = order.inflight[offset] = self._held(qid, offset, fields)
                    at = (topic, qid, offset)
                    self._due.push(held.deadline, _Due((group, topic), state, at, held, order))
                if committed is not None:
                    self._catch_up(group, topic, qid, committed)
        for group_topic, key, fields in sorted(entries, key=lambda e: (e[0], e[1])):
            state = self._state[group_topic]
            stored, qid, offset = key
            held = state.inflight[key] = self._held(qid, offset, fields)
            state.pending.setdefault((stored, qid), {})[offset] = None
            self._due.push(held.deadline, _Due(group_topic, state, key, held, None))
        for (group, _topic), state in self._state.items():
            for (stored, qid), nxt in state.next.items():
                lowest = next(iter(state.pending.get((stored, qid), ())), nxt)
                committed = state.committed[(stored, qid)] = min(nxt, lowest)
                self._catch_up(group, stored, qid, committed)

    def _catch_up(self, group: str, stored: str, qid: int, committed: int) -> None:
        table = self.store.offsets.query(group, stored, qid)
        if table is None or table < committed:
            self.store.offsets.commit(group, stored, qid, committed)
