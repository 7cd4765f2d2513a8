"""What admin tools read: runtime figures, topic and consume statistics, connections.

The answers have RocketMQ 4.9.7's shapes (AdminBrokerProcessor), so ``mqadmin
brokerStatus``, ``clusterList``, ``topicStatus``, ``consumerProgress``,
``consumerConnection``, ``producerConnection``, ``producer``, ``statsAll``,
``topicList -c`` and ``brokerConsumeStats`` print the same facts as on RocketMQ.
"""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING, Any

from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.codes import SCHEDULE_TOPIC
from idemp.remoting.javahash import hash_map_order
from idemp.remoting.jsonlenient import ObjectKeyMap, dumps, mq

from .brokerstats import GROUP_GET_NUMS
from .consumequeue import ConsumeQueue
from .diskguard import disk_used_ratio

if TYPE_CHECKING:
    from .clients import ClientChannel
    from .context import Broker, Handler, Peer
    from .store import MessageStore

VERSION = 407  # MQVersion.CURRENT_VERSION of 4.9.7: what brokerStatus reports
VERSION_DESC = "V4_9_7"


def register(handlers: dict[int, Handler]) -> None:
    handlers[RequestCode.GET_BROKER_RUNTIME_INFO] = runtime_info
    handlers[RequestCode.GET_TOPIC_STATS_INFO] = topic_stats
    handlers[RequestCode.GET_CONSUMER_CONNECTION_LIST] = consumer_connections
    handlers[RequestCode.GET_PRODUCER_CONNECTION_LIST] = producer_connections
    handlers[RequestCode.GET_ALL_PRODUCER_INFO] = all_producers
    handlers[RequestCode.GET_CONSUME_STATS] = consume_stats
    handlers[RequestCode.QUERY_TOPIC_CONSUME_BY_WHO] = topic_consumed_by
    handlers[RequestCode.VIEW_BROKER_STATS_DATA] = view_stats
    handlers[RequestCode.GET_BROKER_CONSUME_STATS] = broker_consume_stats
    handlers[RequestCode.GET_ALL_CONSUMER_OFFSET] = all_consumer_offsets
    handlers[RequestCode.GET_ALL_DELAY_OFFSET] = all_delay_offsets
    handlers[RequestCode.QUERY_CONSUME_TIME_SPAN] = consume_time_span


def _ok(cmd: RemotingCommand, body: Any) -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, body=dumps(body).encode())


def _human_bytes(n: int) -> str:
    """MixAll.humanReadableByteCount(n, false): binary units, one decimal."""
    if n < 1024:
        return f"{n} B"
    exp = 0
    value = float(n)
    while value >= 1024 and exp < 6:
        value /= 1024
        exp += 1
    return f"{value:.1f} {'KMGTPE'[exp - 1]}iB"


def runtime_info(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """GET_BROKER_RUNTIME_INFO: DefaultMessageStore.getRuntimeInfo + prepareRuntimeInfo."""
    store = server.store
    assert store is not None
    stats = store.stats
    info = stats.store_info()
    root = store.root
    usage = shutil.disk_usage(root)  # total and usable, as commitLogDirCapacity reads them
    ratio = repr(disk_used_ratio(root))  # Java's Double.toString for these values
    info.update(
        {
            "commitLogMaxOffset": str(store.commitlog.end),
            # the first mapped file's offset; -1 while none exists (nothing written yet)
            "commitLogMinOffset": "0" if store.commitlog.end else "-1",
            "commitLogDiskRatio": ratio,
            f"commitLogDiskRatio_{root / 'commitlog'}": ratio,
            "consumeQueueDiskRatio": ratio,
            "brokerVersionDesc": VERSION_DESC,
            "brokerVersion": str(VERSION),
            "msgPutTotalYesterdayMorning": str(stats.put_yesterday_morning),
            "msgPutTotalTodayMorning": str(stats.put_today_morning),
            "msgPutTotalTodayNow": str(stats.put_times),
            "msgGetTotalYesterdayMorning": str(stats.get_yesterday_morning),
            "msgGetTotalTodayMorning": str(stats.get_today_morning),
            "msgGetTotalTodayNow": str(stats.get_transferred),
            # requests are served on the event loop: no thread pool queues to wait in
            "sendThreadPoolQueueSize": "0",
            "sendThreadPoolQueueCapacity": "10000",
            "pullThreadPoolQueueSize": "0",
            "pullThreadPoolQueueCapacity": "100000",
            "queryThreadPoolQueueSize": "0",
            "queryThreadPoolQueueCapacity": "20000",
            "EndTransactionQueueSize": "0",
            "EndTransactionThreadPoolQueueCapacity": "100000",
            "dispatchBehindBytes": "0",  # the consume queues are written with the log
            "pageCacheLockTimeMills": "0",
            "sendThreadPoolQueueHeadWaitTimeMills": "0",
            "pullThreadPoolQueueHeadWaitTimeMills": "0",
            "queryThreadPoolQueueHeadWaitTimeMills": "0",
            "earliestMessageTimeStamp": str(_earliest(store)),
            "startAcceptSendRequestTimeStamp": "0",
            "remainTransientStoreBufferNumbs": "2147483647",
            "remainHowManyDataToFlush": _human_bytes(
                max(0, store.commitlog.end - store.commitlog.flushed)
            ),
            "commitLogDirCapacity": (
                f"Total : {_human_bytes(usage.total)}, Free : {_human_bytes(usage.free)}."
            ),
        }
    )
    # ScheduleMessageService.buildRunningStats: each delay level's progress beside its
    # queue's end (the levels delivered from, or loaded from delayOffset.json)
    for level, done in server.scheduler.progress.items():
        end = max(0, store.max_offset(SCHEDULE_TOPIC, level - 1))
        info[f"scheduleMessageOffset_{level}"] = f"{done},{end}"
    return _ok(cmd, {"table": info})


def _earliest(store: MessageStore) -> int:
    """DefaultMessageStore.getEarliestMessageTime: the store time of the first record of
    the commit log, read with a window of twice the maximum message size; RocketMQ gets
    -1 until that much has been written, and so does idemp (clusterList's #Hour)."""
    if store.commitlog.end < 2 * store.config.maxMessageSize:
        return -1
    first = store.lookup(0)
    return first.store_timestamp if first is not None else -1


def topic_stats(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    store = server.store
    assert store is not None
    cmd.require("topic")
    topic = cmd.ext_fields["topic"]
    tcfg = store.topics.get(topic)
    if tcfg is None:
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    table = ObjectKeyMap()
    for qid in range(tcfg.writeQueueNums):
        lo, hi = max(0, store.min_offset(topic, qid)), max(0, store.max_offset(topic, qid))
        cq = store.find_queue(topic, qid)
        ts = cq.store_ts[hi - 1] if cq is not None and hi > 0 else 0
        table.append(
            (
                mq(topic, server.config.brokerName, qid),
                {"lastUpdateTimestamp": ts, "maxOffset": hi, "minOffset": lo},
            )
        )
    return _ok(cmd, {"offsetTable": table})


def _connection(chan: ClientChannel) -> dict[str, Any]:
    return {
        "clientAddr": getattr(chan.channel, "peer", "?"),
        "clientId": chan.client_id,
        "language": chan.language,
        "version": chan.version,
    }


def consumer_connections(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    cmd.require("consumerGroup")
    group = cmd.ext_fields["consumerGroup"]
    info = server.clients.consumers.get(group)
    if info is None:
        return cmd.response(
            ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
        )
    subs = {
        topic: {
            "classFilterMode": False,
            "codeSet": sorted(sub.codes) if sub.codes else [],
            "expressionType": sub.expression_type,
            "subString": sub.sub_string,
            "subVersion": sub.sub_version,
            "tagsSet": sorted(sub.tags),
            "topic": topic,
        }
        for topic, sub in info.subscriptions.items()
    }
    return _ok(
        cmd,
        {
            "connectionSet": [_connection(c) for c in info.channels.values()],
            "consumeFromWhere": info.consume_from_where,
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "subscriptionTable": subs,
        },
    )


def producer_connections(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    cmd.require("producerGroup")
    group = cmd.ext_fields["producerGroup"]
    chans = server.clients.producers.get(group)
    if chans is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
    return _ok(cmd, {"connectionSet": [_connection(c) for c in chans.values()]})


def all_producers(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    data = {
        group: [
            {
                "clientId": c.client_id,
                "remoteIP": "/" + getattr(c.channel, "peer", "?"),
                "language": c.language,
                "version": c.version,
                "lastUpdateTimestamp": c.last_update_ms,
            }
            for c in chans.values()
        ]
        for group, chans in server.clients.producers.items()
    }
    return _ok(cmd, {"data": data})


def _topics_of_group(store: MessageStore, group: str) -> list[str]:
    """ConsumerOffsetManager.whichTopicByConsumer, in its HashSet's order (so
    brokerConsumeStats lists a group's %RETRY% topic where RocketMQ does)."""
    suffix = f"@{group}"
    return hash_map_order(k[: -len(suffix)] for k in store.offsets.table if k.endswith(suffix))


def _consume_stats(server: Broker, group: str, topic: str, queues: int) -> dict[str, Any]:
    store = server.store
    assert store is not None
    table = ObjectKeyMap()
    for qid in range(queues):
        broker_offset = max(0, store.max_offset(topic, qid))
        consumer_offset = max(0, store.offsets.query(group, topic, qid) or 0)
        entry: dict[str, Any] = {
            "brokerOffset": broker_offset,
            "consumerOffset": consumer_offset,
            "lastTimestamp": 0,
        }
        cq = store.find_queue(topic, qid)
        last = consumer_offset - 1
        if cq is not None and cq.min_offset <= last < cq.max_offset:
            entry["lastTimestamp"] = cq.store_ts[last]
        table.append((mq(topic, server.config.brokerName, qid), entry))
    view = store.stats.view(GROUP_GET_NUMS, f"{topic}@{group}")
    tps = view["statsMinute"]["tps"] if view else 0.0
    return {"consumeTps": tps, "offsetTable": table}


def _subscribed_elsewhere(server: Broker, group: str, topic: str) -> bool:
    """An online group that does not subscribe ``topic`` is not reported on it."""
    info = server.clients.consumers.get(group)
    return info is not None and bool(info.subscriptions) and topic not in info.subscriptions


def consume_stats(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    store = server.store
    assert store is not None
    cmd.require("consumerGroup")
    group = cmd.ext_fields["consumerGroup"]
    topic = (cmd.ext_fields.get("topic") or "").strip()
    topics = [topic] if topic else _topics_of_group(store, group)
    offset_table = ObjectKeyMap()
    tps = 0.0
    for t in topics:
        tcfg = store.topics.get(t)
        if tcfg is None or _subscribed_elsewhere(server, group, t):
            continue
        stats = _consume_stats(server, group, t, tcfg.readQueueNums)
        offset_table.extend(stats["offsetTable"])
        tps += stats["consumeTps"]
    return _ok(cmd, {"consumeTps": tps, "offsetTable": offset_table})


def broker_consume_stats(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """GET_BROKER_CONSUME_STATS: every subscription group's ConsumeStats per topic."""
    store = server.store
    assert store is not None
    only_order = (cmd.ext_fields.get("isOrder") or "false").lower() == "true"
    per_group: list[dict[str, Any]] = []
    total_diff = 0
    # in the order RocketMQ's subscription group table iterates its keys: a
    # ConcurrentHashMap created for 1024 entries, so 2048 buckets
    for group in hash_map_order(store.groups.groups, 2048):
        stats_list = []
        for topic in _topics_of_group(store, group):
            tcfg = store.topics.get(topic)
            if tcfg is None or (only_order and not tcfg.order):
                continue
            if _subscribed_elsewhere(server, group, topic):
                continue
            stats = _consume_stats(server, group, topic, tcfg.writeQueueNums)
            total_diff += sum(
                e["brokerOffset"] - e["consumerOffset"] for _, e in stats["offsetTable"]
            )
            stats_list.append(stats)
        per_group.append({group: stats_list})
    return _ok(
        cmd,
        {"brokerAddr": server.broker_addr, "consumeStatsList": per_group, "totalDiff": total_diff},
    )


def topic_consumed_by(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """QUERY_TOPIC_CONSUME_BY_WHO: groups online on the topic, and groups with offsets."""
    store = server.store
    assert store is not None
    cmd.require("topic")
    topic = cmd.ext_fields["topic"]
    groups = {g for g, info in server.clients.consumers.items() if topic in info.subscriptions}
    prefix = f"{topic}@"
    groups |= {k[len(prefix) :] for k in store.offsets.table if k.startswith(prefix)}
    return _ok(cmd, {"groupList": groups})


def view_stats(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    store = server.store
    assert store is not None
    name, key = cmd.ext_fields.get("statsName"), cmd.ext_fields.get("statsKey")
    data = store.stats.view(name, key) if name is not None and key is not None else None
    if data is None:  # an absent field reads "null", as Java's concatenation writes it
        return cmd.response(
            ResponseCode.SYSTEM_ERROR, f"The stats <{_null(name)}> <{_null(key)}> not exist"
        )
    return _ok(cmd, data)


def _null(value: str | None) -> str:
    return "null" if value is None else value


def _java_date(ms: int) -> str:
    """UtilAll.formatDate(new Date(ms), "yyyy-MM-dd#HH:mm:ss:SSS"), local time."""
    secs, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%d#%H:%M:%S", time.localtime(secs)) + f":{millis:03d}"


def consume_time_span(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """QUERY_CONSUME_TIME_SPAN (DefaultMQAdminExt.queryConsumeTimeSpan): per write queue,
    the store times of its first and last message and of the group's last consumed one,
    and how long the next one has waited. RocketMQ 4.9.7's arithmetic, quirks included:
    a group with no offset reads as -1, so its delay is now + 1."""
    store = server.store
    assert store is not None
    cmd.require("topic", "group")
    topic, group = cmd.ext_fields["topic"], cmd.ext_fields["group"]
    tcfg = store.topics.get(topic)
    if tcfg is None:
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    spans = []
    for qid in range(tcfg.writeQueueNums):
        cq = store.find_queue(topic, qid) or ConsumeQueue()  # never written: all -1
        min_time = cq.store_time(cq.min_offset)
        max_time = cq.store_time(cq.max_offset - 1)
        committed = store.offsets.query(group, topic, qid)
        consumer_offset = -1 if committed is None else committed
        consume_time = cq.store_time(consumer_offset - 1) if consumer_offset > 0 else min_time
        delay = 0
        if consumer_offset < cq.max_offset:
            delay = int(time.time() * 1000) - cq.store_time(consumer_offset)
        spans.append(
            {
                "consumeTimeStamp": consume_time,
                "consumeTimeStampStr": _java_date(consume_time),
                "delayTime": delay,
                "maxTimeStamp": max_time,
                "maxTimeStampStr": _java_date(max_time),
                "messageQueue": mq(topic, server.config.brokerName, qid),
                "minTimeStamp": min_time,
                "minTimeStampStr": _java_date(min_time),
            }
        )
    return _ok(cmd, {"consumeTimeSpanSet": spans})


def all_consumer_offsets(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """GET_ALL_CONSUMER_OFFSET: ConsumerOffsetManager.encode (bare integer queue keys)."""
    store = server.store
    assert store is not None
    table = {k: dict(sorted(v.items())) for k, v in store.offsets.table.items()}
    return cmd.response(ResponseCode.SUCCESS, body=_bare_int_keys({"offsetTable": table}))


def all_delay_offsets(server: Broker, conn: Peer, cmd: RemotingCommand) -> RemotingCommand:
    """GET_ALL_DELAY_OFFSET: ScheduleMessageService.encode, level → offset delivered."""
    store = server.store
    assert store is not None
    table = dict(sorted(server.scheduler.progress.items()))
    return cmd.response(ResponseCode.SUCCESS, body=_bare_int_keys({"offsetTable": table}))


def _bare_int_keys(value: Any) -> bytes:
    """fastjson's map of Integer keys: ``{0:12,1:3}``, as RocketMQ's files have them."""
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            key = str(k) if isinstance(k, int) else dumps(str(k))
            items.append(f"{key}:{_bare_int_keys(v).decode()}")
        return ("{" + ",".join(items) + "}").encode()
    return dumps(value).encode()
