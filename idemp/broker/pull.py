"""PULL_MESSAGE (11), as RocketMQ's PullMessageProcessor answers it, with long polling."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from idemp.remoting import MessageExt, PullSysFlag, RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import OFFSET_MOVED_EVENT, Perm
from idemp.remoting.javahash import hash_map_order
from idemp.remoting.javaparse import JavaError, java_int
from idemp.remoting.message import decode_message
from idemp.remoting.sql92 import Selector
from idemp.remoting.tags import SUB_ALL, SubscriptionSplitError, tag_subscription

from .brokerstats import BROKER_GET_NUMS, GROUP_GET_NUMS, GROUP_GET_SIZE
from .clients import compile_or_none, is_tag_type
from .longpoll import HeldPull
from .metadata import topic_error
from .store import GetStatus

if TYPE_CHECKING:
    from .context import Broker, Handler, Peer
    from .metadata import SubscriptionGroupConfig

FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
MAX_HOLD_MS = 25_000  # stay well under the clients' 30 s pull timeout

_CODE = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


def record_matcher(selector: Selector) -> Callable[[bytes], bool]:
    """ExpressionMessageFilter.isMatchedByCommitLog: the expression over the stored
    record's properties (the consume queue's tag codes cannot answer it)."""
    return lambda record: selector.matches(decode_message(record)[0].properties)


def _no_property_filter(cmd: RemotingCommand, expression_type: str) -> RemotingCommand:
    """RocketMQ with enablePropertyFilter=false (its default) refuses an SQL92 pull
    rather than deliver everything or nothing."""
    return cmd.response(
        ResponseCode.SYSTEM_ERROR,
        f"The broker does not support consumer to filter message by {expression_type}",
    )


def _parse_failed(cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(
        ResponseCode.SUBSCRIPTION_PARSE_FAILED, "parse the consumer's subscription failed"
    )


_PULL_NUMBERS = (
    ("queueId", 32),
    ("queueOffset", 64),
    ("maxMsgNums", 32),
    ("sysFlag", 32),
    ("commitOffset", 64),
    ("suspendTimeoutMillis", 64),
    ("subVersion", 64),
)


def _suggested_broker(server: Broker, gcfg: SubscriptionGroupConfig) -> str:
    """PullMessageProcessor: with slaveReadEnable, the group's brokerId (its
    whichBrokerWhenConsumeSlowly only for a pull reading what is no longer in memory,
    which this store never reports), otherwise the master."""
    if server.config.unknown.get("slaveReadEnable", "").strip().lower() == "true":
        return str(gcfg.brokerId)
    return "0"


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.PULL_MESSAGE] = pull_message


def pull_message(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand | None:
    return _process(server, conn, cmd, allow_suspend=True)


def _process(
    server: Broker, conn: Peer, cmd: RemotingCommand, allow_suspend: bool
) -> RemotingCommand | None:
    # PullMessageRequestHeader.decode (a FastCodesHeader): every number there is parsed
    # as Java parses it, in the header's order, and one that does not parse fails the
    # pull with its NumberFormatException; an absent one is null, and fails only where
    # it is read (commitOffset with the commit flag, suspendTimeoutMillis with the
    # suspend flag, subVersion against a heartbeat's subscription)
    for name, bits in _PULL_NUMBERS:
        raw = cmd.ext_fields.get(name)
        if raw is not None:
            java_int(raw, bits)
    cmd.require("consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag")
    store = server.store
    assert store is not None
    group = cmd.ext_fields["consumerGroup"]
    topic = cmd.ext_fields["topic"]
    queue_id = cmd.field_int("queueId")
    offset = cmd.field_int("queueOffset")
    sys_flag = cmd.field_int("sysFlag")
    if sys_flag & PullSysFlag.SUSPEND:  # read first thing, with the flag
        cmd.require("suspendTimeoutMillis")
    if not server.config.brokerPermission & Perm.READ:
        return cmd.response(
            ResponseCode.NO_PERMISSION,
            f"the broker[{server.config.brokerIP1}] pulling message is forbidden",
        )
    gcfg = store.groups.find_or_create(group)
    if gcfg is None:
        return cmd.response(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            f"subscription group [{group}] does not exist, {FAQ}",
        )
    if not gcfg.consumeEnable:
        return cmd.response(
            ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}"
        )
    err = topic_error(topic)
    tcfg = store.topics.get(topic) if err is None else None
    if tcfg is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please! {FAQ}"
        )
    if not tcfg.perm & Perm.READ:
        return cmd.response(
            ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
        )
    if queue_id < 0 or queue_id >= tcfg.readQueueNums:
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
            f"[{tcfg.readQueueNums}] consumer:[/{conn.peer}]",  # Java's InetSocketAddress
        )
    codes: frozenset[int] | None = None
    selector: Selector | None = None
    if sys_flag & PullSysFlag.SUBSCRIPTION:
        # FilterAPI.build(topic, subscription, expressionType): a TAG (or absent) type is
        # parsed as buildSubscriptionData parses it, an absent expression meaning every
        # message; any other type needs an expression
        expression = cmd.ext_fields.get("subscription")
        expression_type = cmd.ext_fields.get("expressionType")
        if expression_type is None or expression_type == "TAG":
            try:
                parsed = tag_subscription(expression)
            except SubscriptionSplitError:
                return _parse_failed(cmd)
            codes = None if parsed is None else parsed[1]
        elif not expression:  # "Expression can't be null!"
            return _parse_failed(cmd)
        elif is_tag_type(expression_type):
            # "": built as a filter expression, so with no tag codes, then matched as a
            # tag subscription: every message for "*", none otherwise
            codes = None if expression == SUB_ALL else frozenset()
        else:
            if not server.config.enablePropertyFilter:
                return _no_property_filter(cmd, str(expression_type))
            # one that does not compile filters nothing: RocketMQ's filter data is then
            # null and its ExpressionMessageFilter lets every message through
            selector = compile_or_none(str(expression_type), expression)
    else:
        info = server.clients.consumers.get(group)
        if info is None:
            return cmd.response(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, f"the consumer's group info not exist{FAQ}"
            )
        if not gcfg.consumeBroadcastEnable and info.message_model == "BROADCASTING":
            return cmd.response(
                ResponseCode.NO_PERMISSION,
                f"the consumer group[{group}] can not consume by broadcast way",
            )
        sub = info.subscriptions.get(topic)
        if sub is None:
            return cmd.response(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, f"the consumer's subscription not exist{FAQ}"
            )
        if sub.sub_version < cmd.field_int("subVersion"):
            return cmd.response(
                ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest"
            )
        if not is_tag_type(sub.expression_type):
            if sub.selector is None:
                return cmd.response(
                    ResponseCode.FILTER_DATA_NOT_EXIST,
                    "The broker's consumer filter data is not exist!Your expression may be wrong!",
                )
            if not server.config.enablePropertyFilter:
                return _no_property_filter(cmd, sub.expression_type)
            selector = sub.selector
        codes = sub.codes
    max_nums = cmd.field_int("maxMsgNums")
    if max_nums < 0 and store.min_offset(topic, queue_id) <= offset < store.max_offset(
        topic, queue_id
    ):  # DefaultMessageStore.getMessage sizes its result lists by it, there only
        raise JavaError(
            f"java.lang.IllegalArgumentException: Illegal Capacity: {max_nums}, "
            "java.base/java.util.ArrayList.<init>(ArrayList.java:160)"
        )
    result = store.get_messages(
        topic,
        queue_id,
        offset,
        max_nums,
        codes,
        None if selector is None else record_matcher(selector),
    )
    if result.records:  # BrokerStatsManager.incGroupGetNums/Size, incBrokerGetNums
        n = len(result.records)
        store.stats.add(GROUP_GET_NUMS, f"{topic}@{group}", n)
        store.stats.add(GROUP_GET_SIZE, f"{topic}@{group}", sum(map(len, result.records)))
        store.stats.add(BROKER_GET_NUMS, server.config.brokerClusterName, n)
    if result.status is GetStatus.NO_MESSAGE_IN_QUEUE:
        code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
    else:
        code = _CODE[result.status]
    if code == ResponseCode.PULL_OFFSET_MOVED:
        _offset_moved_event(server, group, topic, queue_id, offset, result.next_begin_offset)
    if allow_suspend and sys_flag & PullSysFlag.COMMIT_OFFSET:
        store.offsets.commit(group, topic, queue_id, cmd.field_int("commitOffset"))
    if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & PullSysFlag.SUSPEND:
        timeout = (
            cmd.field_int("suspendTimeoutMillis")
            if server.config.longPollingEnable
            else server.config.shortPollingTimeMills
        )
        held = HeldPull(topic, queue_id, offset, codes, lambda: None, owner=conn)

        def rerun() -> None:
            if conn.closed:
                return
            try:
                response = _process(server, conn, cmd, allow_suspend=False)
            except Exception as exc:  # same treatment as a failing handler
                conn._failed(cmd, exc)
                return
            if response is not None:
                conn.reply(response, request=cmd)

        held.rerun = rerun
        server.holds.hold(held, max(0, min(timeout, MAX_HOLD_MS)))
        return None
    response = cmd.response(
        code,
        result.status.value,
        {
            "suggestWhichBrokerId": _suggested_broker(server, gcfg),
            "nextBeginOffset": str(result.next_begin_offset),
            "minOffset": str(result.min_offset),
            "maxOffset": str(result.max_offset),
        },
    )
    if result.records:
        response.body = b"".join(result.records)
    return response


def _offset_moved_event(
    server: Broker, group: str, topic: str, queue_id: int, asked: int, new: int
) -> None:
    """PullMessageProcessor.generateOffsetMovedEvent: a master notes each corrected
    offset in OFFSET_MOVED_EVENT (queue 0, tagged and keyed by the group), where an
    operator's tools read them."""
    store = server.store
    assert store is not None
    queue = {"brokerName": server.config.brokerName, "queueId": queue_id, "topic": topic}
    event = {
        "consumerGroup": group,
        "messageQueue": queue,
        "offsetNew": new,
        "offsetRequest": asked,
    }
    props = {"TAGS": group, "DELAY": "0", "KEYS": group}  # setDelayTimeLevel(0) writes DELAY
    store.put(
        MessageExt(
            topic=OFFSET_MOVED_EVENT,
            queue_id=0,
            body=json.dumps(event, separators=(",", ":")).encode(),
            properties={k: props[k] for k in hash_map_order(props)},
            born_timestamp=int(time.time() * 1000),
            born_host=store.store_host,
        )
    )
