"""The check-back service of transactional messages: which halves are still open, and
the rounds that ask their producers about them.

The check rounds read the half and op topics as RocketMQ's TransactionalMessageServiceImpl
does, as the group CID_RMQ_SYS_TRANS with its own consume offsets: from the first half not
passed yet, skipping those an op resolved, until one too young to ask about. A half old
enough is put back at the end of the half topic with its check count
(TRANSACTION_CHECK_TIMES) and its producer asked about that copy, so a commit then carries
the count; the round's offset moves past the one it replaced. Pending halves are rebuilt
at start from that offset and the ops.

Halves sent by RocketMQ 5 clients (through the gRPC endpoint; they carry
``__transactionId__``, as RocketMQ 5.3.3's broker writes it) are also asked about on 5.3.3's
cadence, ``grpcTransactionCheckInterval`` (30 s), between the 4.9.7 rounds
(``transactionCheckInterval``, 60 s): a round of those passes over 4.x halves without
moving the round's offset past them, so the next full round still finds them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from idemp.remoting import MessageExt, RequestCode, encode_message
from idemp.remoting.codes import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    MessageSysFlag,
    Perm,
    Prop,
)
from idemp.remoting.message import decode_message
from idemp.remoting.msgid import offset_msg_id

from .brokerstats import BROKER_GET_NUMS, GROUP_GET_NUMS, GROUP_GET_SIZE
from .store import GetStatus

if TYPE_CHECKING:
    from .context import Broker

log = logging.getLogger("idemp.broker.transaction")
REMOVE_TAG = "d"
# EndTransactionProcessor.sendFinalMessage's remark when the store refuses the commit
STORE_REFUSED = "Service not available now."

CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # TransactionalMessageUtil.buildConsumerGroup
MAX_PROCESS_TIME_MS = 60_000  # TransactionalMessageServiceImpl.MAX_PROCESS_TIME_LIMIT
_PULL_STATUS = {  # TransactionalMessageBridge.getMessage: the store's status as a pull's
    GetStatus.NO_MATCHED_MESSAGE: "NO_MATCHED_MSG",
    GetStatus.NO_MESSAGE_IN_QUEUE: "NO_NEW_MSG",
    GetStatus.OFFSET_OVERFLOW_ONE: "NO_NEW_MSG",
}
FILE_RESERVED_MS = 72 * 3600 * 1000  # MessageStoreConfig.fileReservedTime's default
COMMIT = MessageSysFlag.TRANSACTION_COMMIT


def put_copy(
    server: Broker,
    msg: MessageExt,
    topic: str,
    *,
    check_times: int,
    extra: dict[str, str] | None = None,
) -> MessageExt:
    """A half's copy in a transaction topic (queue 0) with its check count, as RocketMQ
    builds one to give up on a half, to resume it or to ask about it again; as stored."""
    store = server.store
    assert store is not None
    copy = MessageExt(
        topic=topic,
        queue_id=0,
        body=msg.body,
        flag=msg.flag,
        properties={
            **msg.properties,
            Prop.TRANSACTION_CHECK_TIMES: str(check_times),
            **(extra or {}),
        },
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
    )
    store.put(copy, keep_wait=True)
    return copy


@dataclass(slots=True)
class _Read:
    status: str  # a PullStatus name
    found: list[MessageExt] | None
    next_begin: int


def _now_ms() -> int:
    return int(time.time() * 1000)


def _java_long(text: str) -> int:
    """TransactionalMessageServiceImpl.getLong: the number, or -1."""
    try:
        return int(text)
    except ValueError:
        return -1


def _op_target(op: MessageExt) -> int:
    """The half queue offset an op message's body names (-1: none)."""
    return _java_long(op.body.decode("utf-8", "replace"))


def _immunity_ms(raw: str, timeout_ms: int) -> int:
    """getImmunityTime: CHECK_IMMUNITY_TIME_IN_SECONDS in ms; unreadable: the timeout."""
    seconds = _java_long(raw)
    return timeout_ms if seconds == -1 else seconds * 1000


def _past_reserved_time(half: MessageExt) -> bool:
    """needSkip: older than the commit log's fileReservedTime (72 h)."""
    return _now_ms() - half.born_timestamp > FILE_RESERVED_MS


def _next_check_times(half: MessageExt, check_max: int) -> int | None:
    """needDiscard: the count the next check carries (none yet: 1), or None when the
    half has been checked ``check_max`` times (given up)."""
    raw = half.properties.get(Prop.TRANSACTION_CHECK_TIMES)
    if raw is None:
        return 1
    times = _java_long(raw)
    return None if times >= check_max else times + 1


def _check_times(half: MessageExt) -> int:
    """How often the half was asked about: its TRANSACTION_CHECK_TIMES (none yet: 0)."""
    raw = half.properties.get(Prop.TRANSACTION_CHECK_TIMES, "")
    return int(raw) if raw.isdigit() else 0


class TransactionCheckService:
    """The check rounds of TransactionalMessageServiceImpl.check, which read the half and
    op topics as the consumer group CID_RMQ_SYS_TRANS: its offsets in the consumer offset
    table say how far the rounds have gone, and its reads are counted as a group's gets.

    ``pending`` is idemp's own: the halves not resolved yet, so a second answer to the same
    transaction is not stored twice (RocketMQ would store it). A half put back is the same
    transaction under a new offset: its copies share its UNIQ_KEY, and an answer naming
    any of them, even from before a restart, resolves the latest."""

    def __init__(self, server: Broker) -> None:
        self.server = server
        store = server.store
        assert store is not None
        self.pending: dict[int, int] = {}  # half queue offset -> commit log offset
        self._key_of: dict[int, str] = {}  # pending half -> its UNIQ_KEY
        self._of_v5: set[int] = set()  # pending halves a 5.x client sent
        self._latest: dict[str, int] = {}  # UNIQ_KEY -> the pending half of that key
        half = store.find_queue(TRANS_HALF_TOPIC, 0)
        resolved: set[int] = set()
        op = store.find_queue(TRANS_OP_HALF_TOPIC, 0)
        if op is not None:
            for i in range(op.min_offset, op.max_offset):
                msg = store.lookup(op.phy[i])
                if msg is not None:
                    resolved.add(_op_target(msg))
        if half is not None:
            for i in range(self._offset(TRANS_HALF_TOPIC), half.max_offset):
                if i not in resolved:
                    self._pend(i, half.phy[i])
        store.listeners.append(self._arrived)
        # Other ways to reach a producer of the half's group (RocketMQ 5 clients are asked
        # over their Telemetry stream): each gets the half as checked and its transaction
        # id, and says whether it reached one.
        self.checkers: list[Callable[[MessageExt, str], bool]] = []

    def _arrived(self, topic: str, queue_id: int, max_offset: int, tags_code: int) -> None:
        if topic == TRANS_HALF_TOPIC:
            store = self.server.store
            assert store is not None
            cq = store.queue(TRANS_HALF_TOPIC, 0)
            self._pend(max_offset - 1, cq.phy[max_offset - 1])

    def _pend(self, queue_offset: int, phy: int) -> None:
        store = self.server.store
        assert store is not None
        self.pending[queue_offset] = phy
        half = store.lookup(phy)
        key = half.uniq_key if half is not None else None
        if half is not None and Prop.TRANSACTION_ID in half.properties:
            self._of_v5.add(queue_offset)
        if key:
            earlier = self._latest.get(key)
            if earlier is not None:  # a copy put back (or resumed): the same transaction
                self.pending.pop(earlier, None)
                self._key_of.pop(earlier, None)
                self._of_v5.discard(earlier)
            self._latest[key] = queue_offset
            self._key_of[queue_offset] = key

    def end(self, group: str, queue_offset: int, phy: int, commit: bool) -> str | None:
        store = self.server.store
        assert store is not None
        half = store.lookup(phy)
        if half is None or half.topic != TRANS_HALF_TOPIC:
            return "Find prepared transaction message failed"
        if half.properties.get(Prop.PGROUP) != group:
            return "The producer group wrong"
        if half.queue_offset != queue_offset:
            return "The transaction state table offset wrong"
        live = queue_offset
        if half.uniq_key:  # an answer about an earlier copy resolves the latest
            live = self._latest.get(half.uniq_key, queue_offset)
        if live not in self.pending:
            return None  # already resolved: never store a committed message twice
        if commit and store.disk.full:  # the half stays pending: checked back later
            return STORE_REFUSED
        if commit:
            real = MessageExt(
                topic=half.properties.get(Prop.REAL_TOPIC, ""),
                queue_id=int(half.properties.get(Prop.REAL_QID, "0") or 0),
                body=half.body,
                flag=half.flag,
                properties=dict(half.properties),
                sys_flag=(half.sys_flag & ~MessageSysFlag.TRANSACTION_MASK) | COMMIT,
                born_timestamp=half.born_timestamp,
                born_host=half.born_host,
                reconsume_times=half.reconsume_times,
                prepared_transaction_offset=phy,
            )
            store.put(real, keep_wait=True)
        self._write_op(live)
        return None

    def _write_op(self, queue_offset: int) -> None:
        store = self.server.store
        assert store is not None
        # stored without a topic config, as RocketMQ's bridge writes it: the op topic is
        # never a topic (no route, a pull is TOPIC_NOT_EXIST); its properties are those
        # of a new Message(topic, "d", body): WAIT true, then the tag
        store.put(
            MessageExt(
                topic=TRANS_OP_HALF_TOPIC,
                queue_id=0,
                body=str(queue_offset).encode(),
                properties={Prop.WAIT: "true", Prop.TAGS: REMOVE_TAG},
                born_timestamp=int(time.time() * 1000),
                born_host=store.store_host,
            ),
            keep_wait=True,
        )
        self._done(queue_offset)

    def _done(self, queue_offset: int) -> None:
        self.pending.pop(queue_offset, None)
        self._of_v5.discard(queue_offset)
        key = self._key_of.pop(queue_offset, None)
        if key is not None and self._latest.get(key) == queue_offset:
            del self._latest[key]

    # --- a check round, as TransactionalMessageServiceImpl.check -------------------------
    def _offset(self, topic: str, queue_id: int = 0) -> int:
        """TransactionalMessageBridge.fetchConsumeOffset: the group's, else the queue's min."""
        store = self.server.store
        assert store is not None
        offset = store.offsets.query(CHECK_GROUP, topic, queue_id)
        if offset is None:
            cq = store.find_queue(topic, queue_id)
            offset = cq.min_offset if cq is not None else 0
        return offset

    def _get(self, topic: str, queue_id: int, offset: int, nums: int) -> _Read:
        """TransactionalMessageBridge.getMessage: a read as CID_RMQ_SYS_TRANS, counted."""
        store = self.server.store
        assert store is not None
        result = store.get_messages(topic, queue_id, offset, nums, None)
        if result.status is GetStatus.FOUND and result.records:
            n = len(result.records)
            store.stats.add(GROUP_GET_NUMS, f"{topic}@{CHECK_GROUP}", n)
            store.stats.add(GROUP_GET_SIZE, f"{topic}@{CHECK_GROUP}", sum(map(len, result.records)))
            store.stats.add(BROKER_GET_NUMS, self.server.config.brokerClusterName, n)
            found = [decode_message(r, 0, decompress=False)[0] for r in result.records]
            return _Read("FOUND", found, result.next_begin_offset)
        status = _PULL_STATUS.get(result.status, "OFFSET_ILLEGAL")
        return _Read(status, None, result.next_begin_offset)

    def _fill_removes(
        self, removes: dict[int, int], op_offset: int, min_half: int, done: list[int]
    ) -> _Read:
        """fillOpRemoveMap: the next 32 op messages; each names a half resolved (→ removes,
        by the op's offset) or one the rounds have passed (→ done)."""
        store = self.server.store
        assert store is not None
        read = self._get(TRANS_OP_HALF_TOPIC, 0, op_offset, 32)
        if read.status in ("OFFSET_ILLEGAL", "NO_MATCHED_MSG"):
            store.offsets.commit(CHECK_GROUP, TRANS_OP_HALF_TOPIC, 0, read.next_begin)
        for op in read.found or ():
            if op.properties.get(Prop.TAGS) != REMOVE_TAG:
                log.error("transaction: op message at %d has tag %r", op.queue_offset, op.tags)
                continue
            target = _op_target(op)
            if target < min_half:
                done.append(op.queue_offset)
            else:
                removes[target] = op.queue_offset
        return read

    def check_once(self, only_v5: bool = False) -> int:
        """One round over the half topic's queue 0; return how many checks it sent.
        ``only_v5``: a round of 5.3.3's cadence, which asks about 5.x clients' halves
        only; the first 4.x half it passes stays where the round's offset stops."""
        store = self.server.store
        assert store is not None
        cfg = self.server.config
        if store.disk.full:  # RocketMQ's put back is refused, so it asks about none
            return 0
        started = _now_ms()
        half_offset = self._offset(TRANS_HALF_TOPIC)
        op_offset = self._offset(TRANS_OP_HALF_TOPIC)
        removes: dict[int, int] = {}
        done: list[int] = []
        ops = self._fill_removes(removes, op_offset, half_offset, done)
        misses = 1
        i = new_offset = half_offset
        held: int | None = None  # the first 4.x half a 5.x round passed over
        sent = 0
        while _now_ms() - started <= MAX_PROCESS_TIME_MS:
            if i in removes:  # committed or rolled back
                done.append(removes.pop(i))
            else:
                read = self._get(TRANS_HALF_TOPIC, 0, i, 1)
                if not read.found:
                    misses += 1
                    if misses > 2 or read.status == "NO_NEW_MSG":
                        break
                    i = new_offset = read.next_begin
                    continue
                half = read.found[0]
                if i not in self.pending:  # resolved by an op not read yet, or replaced
                    i = new_offset = i + 1  # by a later copy: never asked about again
                    continue
                if only_v5 and i not in self._of_v5:  # left to the next full round
                    held = i if held is None else held
                    i += 1
                    continue
                times = _next_check_times(half, cfg.transactionCheckMax)
                if times is None or _past_reserved_time(half):
                    self._discard(half, _check_times(half))
                    i = new_offset = i + 1
                    continue
                if half.store_timestamp >= started:  # put back by this round: the next one's
                    break
                age = _now_ms() - half.born_timestamp
                immunity = cfg.transactionTimeOut
                raw = half.properties.get(Prop.CHECK_IMMUNITY_TIME_IN_SECONDS)
                if raw is not None:
                    immunity = _immunity_ms(raw, cfg.transactionTimeOut)
                    if age < immunity:
                        if not self._immune(half, times, removes, done):
                            break
                        i = new_offset = i + 1
                        continue
                elif 0 <= age < immunity:  # too young; so is everything after it
                    break
                last_op = ops.found[-1] if ops.found else None
                if (
                    (last_op is None and age > immunity)
                    or (
                        last_op is not None
                        and last_op.born_timestamp - started > cfg.transactionTimeOut
                    )
                    or age <= -1
                ):
                    self._send_check(half, self._put_back(half, times))
                    sent += 1
                else:  # ops not read yet may resolve it: read them first
                    ops = self._fill_removes(removes, ops.next_begin, half_offset, done)
                    continue
            i = new_offset = i + 1
        if held is not None:
            new_offset = min(new_offset, held)
        if new_offset != half_offset:
            store.offsets.commit(CHECK_GROUP, TRANS_HALF_TOPIC, 0, new_offset)
        new_op_offset = op_offset
        for offset in sorted(done):  # calculateOpOffset: up to the first gap
            if offset != new_op_offset:
                break
            new_op_offset += 1
        if new_op_offset != op_offset:
            store.offsets.commit(CHECK_GROUP, TRANS_OP_HALF_TOPIC, 0, new_op_offset)
        return sent

    def _immune(
        self, half: MessageExt, times: int, removes: dict[int, int], done: list[int]
    ) -> bool:
        """checkPrepareQueueOffset: a half still inside its CHECK_IMMUNITY_TIME is resolved
        if an op names the half it was first stored as, else put back (with the check
        count raised, as RocketMQ's needDiscard raised it) to be looked at next round."""
        raw = half.properties.get(Prop.TRAN_PREPARED_QUEUE_OFFSET)
        if raw is not None:
            first = _java_long(raw)
            if first == -1:
                return False
            if first in removes:
                done.append(removes.pop(first))
                self._done(half.queue_offset)
                return True
        first_offset = half.queue_offset if raw is None else int(raw)
        self._put_back(half, times, {Prop.TRAN_PREPARED_QUEUE_OFFSET: str(first_offset)})
        return True

    def _put_back(
        self, half: MessageExt, times: int, extra: dict[str, str] | None = None
    ) -> MessageExt:
        """TransactionalMessageBridge.renewHalfMessageInner: the half again, at the end of
        the half topic, with its new check count; the round moves past the one it replaces."""
        copy = put_copy(self.server, half, TRANS_HALF_TOPIC, check_times=times, extra=extra)
        self._done(half.queue_offset)  # a copy without a UNIQ_KEY replaces it only here
        return copy

    def _discard(self, half: MessageExt, times: int) -> None:
        """resolveDiscardMsg: given up (checked transactionCheckMax times, or older than the
        files are kept), moved to TRANS_CHECK_MAX_TIME_TOPIC; the round moves past it."""
        store = self.server.store
        assert store is not None
        log.warning(
            "transaction: half message %s checked %d times; moved to %s",
            half.uniq_key,
            times,
            TRANS_CHECK_MAX_TIME_TOPIC,
        )
        store.topics.create_system(TRANS_CHECK_MAX_TIME_TOPIC, 1, Perm.READ | Perm.WRITE)
        # RocketMQ's half carries its check count, put back with each check
        put_copy(self.server, half, TRANS_CHECK_MAX_TIME_TOPIC, check_times=times)
        self._done(half.queue_offset)

    def _send_check(self, half: MessageExt, copy: MessageExt) -> None:
        """AbstractTransactionalMessageCheckListener.sendCheckMessage: the half as read,
        under its real topic, at the copy's offsets; its properties are the copy's, with
        WAIT false (renewHalfMessageInner shares the map it sets that in)."""
        group = half.properties.get(Prop.PGROUP, "")
        store = self.server.store
        assert store is not None
        view = MessageExt(
            topic=half.properties.get(Prop.REAL_TOPIC, half.topic),
            queue_id=int(half.properties.get(Prop.REAL_QID, "0") or 0),
            body=half.body,
            flag=half.flag,
            properties={**copy.properties, Prop.WAIT: "false"},
            queue_offset=copy.queue_offset,
            commit_log_offset=copy.commit_log_offset,
            sys_flag=half.sys_flag,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_timestamp=half.store_timestamp,
            store_host=half.store_host,
            reconsume_times=half.reconsume_times,
        )
        uniq = half.uniq_key or ""
        channel = self.server.clients.producer_channel(group)
        if channel is None:  # the transaction id is the message's, as the broker's check sets it
            if not any(check(view, uniq) for check in self.checkers):
                log.info("transaction: no live producer of group %r to check %s", group, uniq)
            return
        channel.channel.send_request_oneway(
            RequestCode.CHECK_TRANSACTION_STATE,
            {
                "commitLogOffset": str(copy.commit_log_offset),
                "tranStateTableOffset": str(copy.queue_offset),
                "msgId": uniq,
                "transactionId": uniq,
                "offsetMsgId": offset_msg_id(store.store_host, copy.commit_log_offset),
            },
            encode_message(view),
        )

    async def run(self) -> None:
        """Full rounds every ``transactionCheckInterval`` (RocketMQ 4.9.7's 60 s), and
        rounds of 5.x clients' halves every ``grpcTransactionCheckInterval`` (5.3.3's
        30 s) while any is pending. Each wait starts when the last round ended and reads
        its setting again, as RocketMQ's service does, so updateBrokerConfig takes effect
        from the next one; a full round serves the 5.x halves too, so it restarts their wait."""
        cfg = self.server.config
        store = self.server.store
        assert store is not None
        loop = asyncio.get_running_loop()
        start = loop.time()
        due_full = start + _interval_s(cfg.transactionCheckInterval)
        due_v5 = start + _interval_s(cfg.grpcTransactionCheckInterval)
        while True:
            full = due_full <= due_v5
            await asyncio.sleep(max(0.0, min(due_full, due_v5) - loop.time()))
            if full:
                # RocketMQ's round looks the half topic up and creates it the first time
                # (TransactionalMessageBridge.fetchMessageQueues), halves or not: before
                # it, the topic has no config and no route, though halves are stored in it
                store.topics.create_system(TRANS_HALF_TOPIC, 1, Perm.READ | Perm.WRITE)
            if full or self._of_v5:
                try:
                    self.check_once(only_v5=not full)
                except Exception:  # as RocketMQ's "Check error": the next one tries again
                    log.exception("transaction: check round failed")
            ended = loop.time()
            if full:
                due_full = ended + _interval_s(cfg.transactionCheckInterval)
            due_v5 = ended + _interval_s(cfg.grpcTransactionCheckInterval)


def _interval_s(ms: int) -> float:
    return max(ms, 100) / 1000
