"""Transactional messages: END_TRANSACTION (37) and the check-back service.

A half message lives in RMQ_SYS_TRANS_HALF_TOPIC; commit re-stores it under its real
topic, and both commit and rollback write an op message (tag "d", body = the half's
queue offset) to RMQ_SYS_TRANS_OP_HALF_TOPIC. Pending halves are therefore "half
offsets without an op", which is rebuilt from the log at start.

Each check round puts a half it asks about back into the half topic with its check count
(TRANSACTION_CHECK_TIMES) and asks about that copy, as RocketMQ's
TransactionalMessageServiceImpl does: the producer's answer names the copy, and a commit
then carries the count. The half it replaced gets an op here (RocketMQ moves its own
consume offset past it instead), so a restart does not ask about both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from idemp.remoting import MessageExt, RemotingCommand, RequestCode, ResponseCode, encode_message
from idemp.remoting.codes import (
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    UNSET_RESPONSE_REMARK,
    MessageSysFlag,
    Perm,
    Prop,
)
from idemp.remoting.msgid import offset_msg_id, parse_offset_msg_id

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer

log = logging.getLogger("idemp.broker.transaction")
REMOVE_TAG = "d"
# EndTransactionProcessor.sendFinalMessage's remark when the store refuses the commit
STORE_REFUSED = "Service not available now."
# AdminBrokerProcessor.resumeCheckHalfMessage's remarks
RESUME_FAILED = "Exception was thrown when putting message back to RMQ_SYS_TRANS_HALF_TOPIC."
RESUME_REFUSED = "Put message back to RMQ_SYS_TRANS_HALF_TOPIC failed."

COMMIT = MessageSysFlag.TRANSACTION_COMMIT
ROLLBACK = MessageSysFlag.TRANSACTION_ROLLBACK


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.END_TRANSACTION] = end_transaction
    handlers[RequestCode.RESUME_CHECK_HALF_MESSAGE] = resume_check_half_message


def end_transaction(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand | None:
    cmd.require("producerGroup", "tranStateTableOffset", "commitLogOffset", "commitOrRollback")
    kind = cmd.field_int("commitOrRollback")
    if kind not in (COMMIT, ROLLBACK):
        return None  # TRANSACTION_NOT_TYPE: RocketMQ neither acts nor answers
    service: TransactionCheckService = server.transactions
    error = service.end(
        cmd.ext_fields["producerGroup"],
        cmd.field_int("tranStateTableOffset"),
        cmd.field_int("commitLogOffset"),
        commit=kind == COMMIT,
    )
    if error == STORE_REFUSED:
        return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, error)
    if error:
        return cmd.response(ResponseCode.SYSTEM_ERROR, error)
    # a commit answers with the final message's put (remark cleared); a rollback with
    # checkPrepareMessage's response, whose default remark RocketMQ 4.9.7 leaves in place
    return cmd.response(ResponseCode.SUCCESS, None if kind == COMMIT else UNSET_RESPONSE_REMARK)


def resume_check_half_message(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """RESUME_CHECK_HALF_MESSAGE (323, DefaultMQAdminExt.resumeCheckHalfMessage): a half
    given up after transactionCheckMax checks (in TRANS_CHECK_MAX_TIME_TOPIC) is put back
    as a new half with its check count at 0, so its producer is asked again."""
    store = server.store
    assert store is not None
    cmd.require("msgId")
    try:
        _, phy = parse_offset_msg_id(cmd.ext_fields["msgId"])
    except ValueError:
        return cmd.response(ResponseCode.SYSTEM_ERROR, RESUME_FAILED)
    msg = store.lookup(phy)
    if msg is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, RESUME_FAILED)
    if Prop.REAL_TOPIC not in msg.properties:
        # RocketMQ copies whatever record the id points at, a plain message too, into
        # the half topic; a record that never was a half has no topic to commit it to
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            f"message {cmd.ext_fields['msgId']} is not a transaction half message "
            "(it has no REAL_TOPIC); nothing was put back",
        )
    if store.disk.full:
        return cmd.response(ResponseCode.SYSTEM_ERROR, RESUME_REFUSED)
    _put_copy(server, msg, TRANS_HALF_TOPIC, check_times=0)
    log.info(
        "transaction: half message %s put back to %s (real topic %s)",
        msg.uniq_key,
        TRANS_HALF_TOPIC,
        msg.properties[Prop.REAL_TOPIC],
    )
    return cmd.response(ResponseCode.SUCCESS)


def _put_copy(server: Broker, msg: MessageExt, topic: str, *, check_times: int) -> MessageExt:
    """A half's copy in a transaction topic (queue 0) with its check count, as RocketMQ
    builds one to give up on a half, to resume it or to ask about it again; as stored."""
    store = server.store
    assert store is not None
    copy = MessageExt(
        topic=topic,
        queue_id=0,
        body=msg.body,
        flag=msg.flag,
        properties={**msg.properties, Prop.TRANSACTION_CHECK_TIMES: str(check_times)},
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        reconsume_times=msg.reconsume_times,
    )
    store.put(copy, keep_wait=True)
    return copy


def _check_times(half: MessageExt) -> int:
    """How often the half was asked about: its TRANSACTION_CHECK_TIMES (none yet: 0)."""
    raw = half.properties.get(Prop.TRANSACTION_CHECK_TIMES, "")
    return int(raw) if raw.isdigit() else 0


class TransactionCheckService:
    def __init__(self, server: Broker) -> None:
        self.server = server
        store = server.store
        assert store is not None
        self.pending: dict[int, int] = {}  # half queue offset -> commit log offset
        half = store.find_queue(TRANS_HALF_TOPIC, 0)
        if half is not None:
            for i in range(half.min_offset, half.max_offset):
                self.pending[i] = half.phy[i]
        op = store.find_queue(TRANS_OP_HALF_TOPIC, 0)
        if op is not None:
            for i in range(op.min_offset, op.max_offset):
                msg = store.lookup(op.phy[i])
                if msg is not None:
                    try:
                        self.pending.pop(int(msg.body.decode()), None)
                    except ValueError:
                        pass
        # what check rounds put back: each earlier queue offset of a half -> its live
        # copy's (a producer may answer about any of them), and the other way round
        self.superseded: dict[int, int] = {}
        self._replaced: dict[int, list[int]] = {}
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
            self.pending[max_offset - 1] = cq.phy[max_offset - 1]

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
        live = self.superseded.get(queue_offset, queue_offset)  # an answer to an older ask
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
        # never a topic (no route, a pull is TOPIC_NOT_EXIST)
        store.put(
            MessageExt(
                topic=TRANS_OP_HALF_TOPIC,
                queue_id=0,
                body=str(queue_offset).encode(),
                properties={Prop.TAGS: REMOVE_TAG},
                born_timestamp=int(time.time() * 1000),
                born_host=store.store_host,
            )
        )
        self.pending.pop(queue_offset, None)
        for earlier in self._replaced.pop(queue_offset, ()):
            self.superseded.pop(earlier, None)

    def check_once(self, now_ms: int) -> int:
        """Send CHECK_TRANSACTION_STATE for every half old enough; return how many."""
        store = self.server.store
        assert store is not None
        cfg = self.server.config
        if store.disk.full:  # RocketMQ's put back is refused, so it asks about none
            return 0
        sent = 0
        # a snapshot: the copies this round puts back are asked about from the next one
        for _, phy in sorted(self.pending.items()):
            half = store.lookup(phy)
            if half is None:
                continue
            immunity = cfg.transactionTimeOut
            raw_immunity = half.properties.get(Prop.CHECK_IMMUNITY_TIME_IN_SECONDS)
            if raw_immunity and raw_immunity.isdigit():
                immunity = int(raw_immunity) * 1000
            if now_ms - half.born_timestamp < immunity:
                continue
            times = _check_times(half)
            if times >= cfg.transactionCheckMax:
                self._discard(half, times)
                continue
            self._send_check(half, self._put_back(half, times + 1))
            sent += 1
        return sent

    def _put_back(self, half: MessageExt, times: int) -> MessageExt:
        """TransactionalMessageBridge.renewHalfMessageInner: the half again, at the end of
        the half topic, with its new check count; the one it replaces is done."""
        copy = _put_copy(self.server, half, TRANS_HALF_TOPIC, check_times=times)  # pending now
        earlier = [*self._replaced.pop(half.queue_offset, ()), half.queue_offset]
        for offset in earlier:
            self.superseded[offset] = copy.queue_offset
        self._replaced[copy.queue_offset] = earlier
        self._write_op(half.queue_offset)
        return copy

    def _discard(self, half: MessageExt, times: int) -> None:
        store = self.server.store
        assert store is not None
        log.warning(
            "transaction: half message %s checked %d times; moved to %s",
            half.uniq_key,
            self.server.config.transactionCheckMax,
            TRANS_CHECK_MAX_TIME_TOPIC,
        )
        store.topics.create_system(TRANS_CHECK_MAX_TIME_TOPIC, 1, Perm.READ | Perm.WRITE)
        # RocketMQ's half carries its check count, put back with each check
        _put_copy(self.server, half, TRANS_CHECK_MAX_TIME_TOPIC, check_times=times)
        self._write_op(half.queue_offset)

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
        interval = max(self.server.config.transactionCheckInterval, 100) / 1000
        store = self.server.store
        assert store is not None
        while True:
            await asyncio.sleep(interval)
            # RocketMQ's round looks the half topic up and creates it the first time
            # (TransactionalMessageBridge.fetchMessageQueues), halves or not: before it,
            # the topic has no config and no route, though halves are stored in it
            store.topics.create_system(TRANS_HALF_TOPIC, 1, Perm.READ | Perm.WRITE)
            if self.pending:
                self.check_once(int(time.time() * 1000))
