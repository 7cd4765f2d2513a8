"""Transactional messages: END_TRANSACTION (37) and RESUME_CHECK_HALF_MESSAGE (323).

A half message lives in RMQ_SYS_TRANS_HALF_TOPIC; commit re-stores it under its real
topic, and both commit and rollback write an op message (tag "d", body = the half's
queue offset) to RMQ_SYS_TRANS_OP_HALF_TOPIC. Which halves are still open, and the
check rounds that ask their producers, are the check service's (``halfcheck``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import TRANS_HALF_TOPIC, UNSET_RESPONSE_REMARK, MessageSysFlag, Prop
from idemp.remoting.msgid import parse_offset_msg_id

from .halfcheck import STORE_REFUSED, TransactionCheckService, put_copy

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer

log = logging.getLogger("idemp.broker.transaction")
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
    put_copy(server, msg, TRANS_HALF_TOPIC, check_times=0)
    log.info(
        "transaction: half message %s put back to %s (real topic %s)",
        msg.uniq_key,
        TRANS_HALF_TOPIC,
        msg.properties[Prop.REAL_TOPIC],
    )
    return cmd.response(ResponseCode.SUCCESS)
