"""The admin requests mqadmin 4.9.7 sends, answered as RocketMQ 4.9.7 answers them (issue
12 §2; shapes from AdminBrokerProcessor and the nameserver's DefaultRequestProcessor).
``make interop`` runs mqadmin itself against idemp's broker; these tests pin the answers
in ``make test``, each exact."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idemp.broker import diskguard
from idemp.broker.process import BrokerProcess
from idemp.remoting import RemotingCommand, RequestCode, ResponseCode
from idemp.remoting.jsonlenient import loads_fastjson
from tests.broker.rawclient import RawClient
from tests.realbroker import RealBroker, broker_of, real_home

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers

TOPIC, GROUP = "AdminTopic", "AdminGroup"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module: AdminTopic (2 queues) with 3 messages on queue 0 and 1
    on queue 1; AdminGroup committed offset 2 on queue 0 and 1 on queue 1."""
    with broker_of(tmp_path_factory.mktemp("admin") / "store", None, HERE) as b:
        with RawClient(b.broker_addr) as c:
            assert c.create_topic(TOPIC, 2).code == 0
            for i in range(3):
                assert c.send_message(TOPIC, f"m{i}".encode(), {"KEYS": f"k{i}"}).code == 0
            assert c.send_message(TOPIC, b"m3", queue_id=1).code == 0
            for qid, offset in ((0, 2), (1, 1)):
                r = c.request(
                    RequestCode.UPDATE_CONSUMER_OFFSET,
                    {
                        "consumerGroup": GROUP,
                        "topic": TOPIC,
                        "queueId": qid,
                        "commitOffset": offset,
                    },
                )
                assert r.code == 0
            assert c.pull(TOPIC, 0, 0, group=GROUP).code == 0  # 3 messages transferred
        yield b


def _body(resp: RemotingCommand) -> Any:
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return loads_fastjson(resp.body)


def _route_perm(ns: RawClient, topic: str) -> int:
    """The perm of the topic's first queue data in the nameserver's route."""
    route = _body(ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))
    return int(route["queueDatas"][0]["perm"])


def _commit_on_both_queues(admin: RawClient, group: str) -> None:
    """Offset 1 for ``group`` on each of AdminTopic's queues (a reset needs them all)."""
    for qid in (0, 1):
        commit = {"consumerGroup": group, "topic": TOPIC, "queueId": qid, "commitOffset": 1}
        assert admin.request(RequestCode.UPDATE_CONSUMER_OFFSET, commit).code == 0


def _queues(table: list[tuple[dict[str, Any], Any]]) -> dict[int, Any]:
    return {key["queueId"]: value for key, value in table}


def test_runtime_info_reports_what_the_store_did(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        info = _body(c.request(RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
    assert info["brokerVersionDesc"] == "V4_9_7" and info["brokerVersion"] == "407"
    assert info["putMessageTimesTotal"] == "4" and info["msgPutTotalTodayNow"] == "4"
    assert info["msgGetTotalTodayNow"] == "3"  # one pull of three messages
    assert info["putMessageFailedTimes"] == "0"
    assert float(info["putMessageAverageSize"]) * 4 == float(info["putMessageSizeTotal"])
    assert info["putMessageSizeTotal"] == info["commitLogMaxOffset"]  # the four records
    assert info["earliestMessageTimeStamp"] == "-1"  # as RocketMQ: < 2 x maxMessageSize
    assert info["commitLogMinOffset"] == "0"
    assert info["runtime"].startswith("[ 0 days, 0 hours, ")


def test_runtime_info_reports_each_delay_levels_progress(broker: BrokerProcess) -> None:
    """mqadmin brokerStatus's scheduleMessageOffset_<level>: how far the level's queue has
    been delivered, beside its end (side by side with RocketMQ 4.9.7, 2026-11-28)."""
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("AdminDelayed", 1).code == 0
        before = _body(c.request(RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
        assert c.send_message("AdminDelayed", b"d", {"DELAY": "1"}).code == 0  # 1 s
        assert c.indexed("AdminDelayed", 0, 1) == 1  # delivered to its topic
        deadline = time.monotonic() + 5
        while True:  # RocketMQ notes the level's progress once the delivery is stored
            info = _body(c.request(RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
            if "scheduleMessageOffset_1" in info or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert not any(k.startswith("scheduleMessageOffset_") for k in before)
    assert {k: v for k, v in info.items() if k.startswith("scheduleMessageOffset_")} == {
        "scheduleMessageOffset_1": "1,1"
    }


def test_topic_and_consume_stats(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        stats = _queues(
            _body(c.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC}))["offsetTable"]
        )
        consume = _body(c.request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": GROUP}))
        missing = c.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "NoSuchTopic"})
        by_who = _body(c.request(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": TOPIC}))
    assert {q: (v["minOffset"], v["maxOffset"]) for q, v in stats.items()} == {0: (0, 3), 1: (0, 1)}
    assert all(v["lastUpdateTimestamp"] > 0 for v in stats.values())
    assert (missing.code, missing.remark) == (
        ResponseCode.TOPIC_NOT_EXIST,
        "topic[NoSuchTopic] not exist",
    )
    offsets = _queues(consume["offsetTable"])
    assert {q: (v["brokerOffset"], v["consumerOffset"]) for q, v in offsets.items()} == {
        0: (3, 2),
        1: (1, 1),
    }
    assert offsets[0]["lastTimestamp"] > 0 and consume["consumeTps"] == 0.0
    assert by_who == {"groupList": [GROUP]}


def test_consume_time_span(broker: BrokerProcess) -> None:
    """QUERY_CONSUME_TIME_SPAN (303), as RocketMQ 4.9.7 answered the same requests side by
    side (2026-11-27): store times of each queue's first, last and last consumed message;
    a group without an offset counts as offset -1 (its delay: now + 1)."""
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("SpanEmpty", 1).code == 0
        first = [
            int(
                c.request(
                    RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": TOPIC, "queueId": q}
                ).ext_fields["timestamp"]
            )
            for q in (0, 1)
        ]
        stats = _queues(
            _body(c.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": TOPIC}))["offsetTable"]
        )
        consumed = _queues(
            _body(c.request(RequestCode.GET_CONSUME_STATS, {"consumerGroup": GROUP}))["offsetTable"]
        )
        before = int(time.time() * 1000)
        spans = {
            group: _body(
                c.request(RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": TOPIC, "group": group})
            )["consumeTimeSpanSet"]
            for group in (GROUP, "NoSuchGroup")
        }
        after = int(time.time() * 1000)
        (empty,) = _body(
            c.request(RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "SpanEmpty", "group": GROUP})
        )["consumeTimeSpanSet"]
        missing = c.request(
            RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "NoSuchTopic", "group": GROUP}
        )
    last = [stats[q]["lastUpdateTimestamp"] for q in (0, 1)]
    times = {
        g: [(s["minTimeStamp"], s["maxTimeStamp"], s["consumeTimeStamp"]) for s in v]
        for g, v in spans.items()
    }
    assert times == {
        GROUP: [(first[0], last[0], consumed[0]["lastTimestamp"]), (first[1], last[1], last[1])],
        "NoSuchGroup": [(first[0], last[0], first[0]), (first[1], last[1], first[1])],
    }
    assert [s["messageQueue"] for s in spans[GROUP]] == [
        {"brokerName": "broker-a", "queueId": q, "topic": TOPIC} for q in (0, 1)
    ]
    own = [s["delayTime"] for s in spans[GROUP]]
    assert before - last[0] <= own[0] <= after - last[0] and own[1] == 0  # q1 all consumed
    assert all(before + 1 <= s["delayTime"] <= after + 1 for s in spans["NoSuchGroup"])
    span = spans[GROUP][0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d#\d\d:\d\d:\d\d:\d{3}", span["minTimeStampStr"])
    assert span["minTimeStampStr"].endswith(f":{first[0] % 1000:03d}")
    assert (empty["minTimeStamp"], empty["maxTimeStamp"], empty["consumeTimeStamp"]) == (-1,) * 3
    # no offset there either: -1 < max offset 0, and the "next" message's time is -1
    assert empty["delayTime"] >= before + 1 and empty["maxTimeStampStr"].endswith(":59:999")
    assert (missing.code, missing.remark) == (
        ResponseCode.TOPIC_NOT_EXIST,
        "topic[NoSuchTopic] not exist",
    )


@pytest.mark.idemp_only("a RocketMQ 5 request: 4.9.7 answers 'request type 351 not supported'")
def test_one_topic_config_as_rocketmq_5_answers_it(broker: BrokerProcess) -> None:
    """GET_TOPIC_CONFIG (351): mqadmin 5's topicStatus asks it before the stats."""
    with RawClient(broker.broker_addr) as c:
        cfg = _body(c.request(RequestCode.GET_TOPIC_CONFIG, {"topic": TOPIC}))
        missing = c.request(RequestCode.GET_TOPIC_CONFIG, {"topic": "NoSuchTopic"})
    assert (cfg["topicName"], cfg["readQueueNums"], cfg["writeQueueNums"]) == (TOPIC, 2, 2)
    assert (cfg["perm"], cfg["order"], cfg["attributes"]) == (6, False, {})
    assert (missing.code, missing.remark) == (
        ResponseCode.TOPIC_NOT_EXIST,
        "No topic in this broker. topic: NoSuchTopic",
    )


def test_connections_of_online_and_unknown_groups(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        assert (
            c.heartbeat(
                "cid-1", consumer_groups=["OnlineGroup"], producer_groups=["PG"], topic=TOPIC
            ).code
            == 0
        )
        consumers = _body(
            c.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "OnlineGroup"})
        )
        offline = c.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "Nobody"})
        producers = _body(
            c.request(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG"})
        )
        unknown = c.request(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "NoPG"})
        everyone = _body(c.request(RequestCode.GET_ALL_PRODUCER_INFO))
        local = c.local_addr
    assert consumers["connectionSet"] == [
        {"clientAddr": local, "clientId": "cid-1", "language": "JAVA", "version": 409}
    ]
    assert consumers["consumeType"] == "CONSUME_PASSIVELY"
    assert consumers["messageModel"] == "CLUSTERING"
    assert consumers["subscriptionTable"][TOPIC]["subString"] == "*"
    assert (offline.code, offline.remark) == (
        ResponseCode.CONSUMER_NOT_ONLINE,
        "the consumer group[Nobody] not online",
    )
    assert producers == {
        "connectionSet": [
            {"clientAddr": local, "clientId": "cid-1", "language": "JAVA", "version": 409}
        ]
    }
    assert (unknown.code, unknown.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "the producer group[NoPG] not exist",
    )
    (info,) = everyone["data"]["PG"]
    assert (info["clientId"], info["remoteIP"], info["version"]) == ("cid-1", "/" + local, 409)
    # the producer's connection closed (a killed producer): its group stays, empty, as
    # ProducerManager.doChannelCloseEvent leaves it (mqadmin: "Not found the producer
    # group connection"); only UNREGISTER_CLIENT removes a group
    with RawClient(broker.broker_addr) as c:
        deadline = time.monotonic() + 10
        while (
            left := _body(
                c.request(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG"})
            )
        )["connectionSet"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the broker hears of the closed connection a moment later
        assert left == {"connectionSet": []}


def test_broker_config_get_and_update(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        before = c.request(RequestCode.GET_BROKER_CONFIG)
        update = c.request(
            RequestCode.UPDATE_BROKER_CONFIG,
            body=b"maxMessageSize=2048\ndefaultTopicQueueNums=oops\nfileReservedTime=48\n"
            b"noSuchKeyAtAll=1\n=x\ntraceOn=maybe\nflushDiskType=WRONG\nbrokerRole=sync_master\n",
        )
        after = c.request(RequestCode.GET_BROKER_CONFIG)
        big = c.send_message(TOPIC, b"x" * 4096)
        c.request(RequestCode.UPDATE_BROKER_CONFIG, body=b"maxMessageSize=4194304\n")
    lines = dict(line.split("=", 1) for line in before.body.decode().splitlines())
    assert lines["brokerName"] == "broker-a" and lines["maxMessageSize"] == "4194304"
    assert json.loads(before.ext_fields["version"])["counter"] == 0
    # RocketMQ's whole set, not only what idemp models: mqadmin exportConfigs reads these
    # (and fails on a missing one), at RocketMQ 4.9.7's defaults
    exported = ("brokerRole", "fileReservedTime", "filterServerNums", "msgTraceTopicName")
    assert [lines[k] for k in exported] == ["ASYNC_MASTER", "72", "0", "RMQ_SYS_TRACE_TOPIC"]
    assert (lines["slaveReadEnable"], lines["traceTopicEnable"], lines["useTLS"]) == (
        "false",
        "false",
        "false",
    )
    assert lines["storePathCommitLog"] == str(Path(lines["storePathRootDir"]) / "commitlog")
    assert lines["haListenPort"] == str(int(lines["listenPort"]) + 1)
    # the nameserver the broker registers with, by the port it has (idemp's own, bound
    # on a free port here, had been reported as ":0")
    assert lines["namesrvAddr"] == broker.namesrv_addr
    assert lines["messageStorePlugIn"] == ""  # an empty value is reported, a null one not
    assert len(lines) >= 170  # RocketMQ 4.9.7 reports 176
    assert update.code == ResponseCode.SUCCESS  # a value that does not parse is ignored
    after_lines = dict(line.split("=", 1) for line in after.body.decode().splitlines())
    assert after_lines["maxMessageSize"] == "2048" and after_lines["defaultTopicQueueNums"] == "8"
    assert after_lines["fileReservedTime"] == "48"  # reported as set; idemp does not act on it
    # Configuration.update: keys no config object has are dropped, a boolean is
    # Boolean.parseBoolean's
    assert "noSuchKeyAtAll" not in after_lines and "" not in after_lines
    assert after_lines["traceOn"] == "false"
    # an enum's String setter calls valueOf: a value naming no constant is ignored
    assert (after_lines["flushDiskType"], after_lines["brokerRole"]) == (
        "ASYNC_FLUSH",
        "ASYNC_MASTER",
    )
    assert json.loads(after.ext_fields["version"])["counter"] == 1
    assert big.code == ResponseCode.MESSAGE_ILLEGAL  # the new limit is in force


@pytest.mark.idemp_only(
    "restarts a broker on the same -c file; RocketMQ 4.9.7's harness writes it anew"
)
def test_update_broker_config_rewrites_the_config_file_and_outlives_a_restart(
    tmp_path: Path,
) -> None:
    """Configuration.persist: the file given with -c is rewritten with every setting,
    getBrokerConfig's lines, the one before kept as .bak. Measured on RocketMQ 4.9.7:
    an 8-line broker.conf became its 177 lines, with the new value, and broker.conf.bak
    the 8 lines."""
    conf = tmp_path / "broker.conf"
    given = "brokerName=broker-p\nmaxMessageSize=4096\ndeleteWhen=01\n"
    conf.write_text(given)
    broker = BrokerProcess(tmp_path / "store", config_file=conf).start()
    try:
        with RawClient(broker.broker_addr) as c:
            assert c.update_broker_config(maxMessageSize=2048, noSuchKeyAtAll=1).code == 0
            reported = c.request(RequestCode.GET_BROKER_CONFIG).body.decode()
        assert conf.read_text() == reported
        assert (tmp_path / "broker.conf.bak").read_text() == given
        broker.stop()
        broker.start()
        with RawClient(broker.broker_addr) as c:
            body = c.request(RequestCode.GET_BROKER_CONFIG).body.decode()
        lines = dict(line.split("=", 1) for line in body.splitlines())
        assert (lines["brokerName"], lines["maxMessageSize"], lines["deleteWhen"]) == (
            "broker-p",
            "2048",
            "01",
        )
        assert "noSuchKeyAtAll" not in lines
    finally:
        broker.stop()
    # at each start, only the setting idemp does not act on and the file sets to other
    # than RocketMQ's default is worth a warning, not the rest of the rewritten file's
    warned = [
        line.split("broker.conf: ")[1]
        for line in broker.log_path.read_text().splitlines()
        if "is not acted on by idemp" in line
    ]
    assert warned == ["deleteWhen=01 is not acted on by idemp"] * 2


def test_delete_topic_and_group(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with broker_of(store, None, HERE) as b, RawClient(b.broker_addr) as c:
        assert c.create_topic("Doomed", 1).code == 0
        assert c.send_message("Doomed", b"old").code == 0
        system = c.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "TBW102"})
        assert c.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Doomed"}).code == 0
        with RawClient(b.namesrv_addr) as ns:
            assert ns.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "Doomed"}).code == 0
            no_route = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Doomed"})
        gone = c.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Doomed"})
        assert (
            c.request(
                RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                body=json.dumps({"groupName": "G1"}).encode(),
            ).code
            == 0
        )
        assert (
            c.request(
                RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "G1", "removeOffset": "true"}
            ).code
            == 0
        )
        groups = _body(c.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    assert (system.code, system.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "The topic[TBW102] is conflict with system topic.",
    )
    assert gone.code == ResponseCode.TOPIC_NOT_EXIST
    assert no_route.code == ResponseCode.TOPIC_NOT_EXIST
    assert "G1" not in groups["subscriptionGroupTable"]
    with broker_of(store, None, HERE) as b, RawClient(b.broker_addr) as c:  # restarted
        assert c.create_topic("Doomed", 1).code == 0
        # idemp keeps a deleted topic's records out of its queues for good. RocketMQ 4.9.7
        # indexes its commit log again at start from the highest offset its remaining
        # consume queues hold (DefaultMessageStore.start), here none: "old" comes back
        old = [b"old"] if real_home() else []
        assert c.indexed("Doomed", 0, len(old)) == len(old)
        assert c.send_message("Doomed", b"new").code == 0
        assert c.indexed("Doomed", 0, len(old) + 1) == len(old) + 1
        assert [m.body for m in c.pull_messages("Doomed")] == [*old, b"new"]


def test_system_groups_exist_when_groups_are_not_auto_created(tmp_path: Path) -> None:
    """RocketMQ 4.9.7 starts with seven groups (mqadmin's pulls use TOOLS_CONSUMER) and
    creates CID_RMQ_SYS_ groups on use even with autoCreateSubscriptionGroup=false; each
    change of the table counts in its dataVersion (measured side by side, 2026-11-27)."""
    store = tmp_path / "store"
    props = {"autoCreateSubscriptionGroup": "false", "autoCreateTopicEnable": "true"}
    with broker_of(store, props, HERE) as b, RawClient(b.broker_addr) as c:
        assert c.send_message("SysGroups", b"x").code == 0
        before = _body(c.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
        pulls = {
            g: c.pull("SysGroups", 0, 0, group=g)
            for g in ("TOOLS_CONSUMER", "NoSuchGroup", "CID_RMQ_SYS_Z1")
        }
        after = _body(c.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
        assert (
            c.request(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "CID_RMQ_SYS_Z1"}).code
            == 0
        )
        assert (
            c.request(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "NoSuchGroup"}).code == 0
        )
        deleted = _body(c.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    system = {
        "CID_ONS-HTTP-PROXY",
        "CID_ONSAPI_OWNER",
        "CID_ONSAPI_PERMISSION",
        "CID_ONSAPI_PULL",
        "FILTERSRV_CONSUMER",
        "SELF_TEST_C_GROUP",
        "TOOLS_CONSUMER",
    }
    assert set(before["subscriptionGroupTable"]) == system
    assert before["subscriptionGroupTable"]["TOOLS_CONSUMER"] == {
        "groupName": "TOOLS_CONSUMER",
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }
    assert [(g, r.code) for g, r in pulls.items()] == [
        ("TOOLS_CONSUMER", ResponseCode.SUCCESS),
        ("NoSuchGroup", ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST),
        ("CID_RMQ_SYS_Z1", ResponseCode.SUCCESS),
    ]
    assert pulls["NoSuchGroup"].remark == (
        "subscription group [NoSuchGroup] does not exist, \n"
        "See http://rocketmq.apache.org/docs/faq/ for further details."
    )
    assert set(after["subscriptionGroupTable"]) == system | {"CID_RMQ_SYS_Z1"}
    versions = [t["dataVersion"] for t in (before, after, deleted)]
    assert [v["counter"] - versions[0]["counter"] for v in versions] == [0, 1, 2]
    assert versions[0]["timestamp"] <= versions[1]["timestamp"] <= versions[2]["timestamp"]
    with broker_of(store, props, HERE) as b, RawClient(b.broker_addr) as c:
        again = _body(c.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
    # the groups are kept in subscriptionGroup.json, their version is not: RocketMQ 4.9.7
    # begins it afresh at every start (fastjson cannot set the manager's final field)
    assert again["dataVersion"]["counter"] == 0
    assert again["dataVersion"]["timestamp"] >= versions[2]["timestamp"]
    assert set(again["subscriptionGroupTable"]) == system


def test_clone_offsets_and_query_consume_queue(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        clone = c.request(
            RequestCode.CLONE_GROUP_OFFSET,
            {"srcGroup": GROUP, "destGroup": "Copy", "topic": TOPIC, "offline": "true"},
        )
        copied = c.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": "Copy", "topic": TOPIC, "queueId": 0},
        )
        cq_answer = c.request(
            RequestCode.QUERY_CONSUME_QUEUE,
            {"topic": TOPIC, "queueId": 0, "index": 1, "count": 5},
        )
        cq = _body(cq_answer)
        created = c.create_topic("RemarkTopic", 1)
        nope = c.request(
            RequestCode.QUERY_CONSUME_QUEUE, {"topic": TOPIC, "queueId": 7, "index": 0, "count": 1}
        )
    assert clone.code == 0 and copied.ext_fields["offset"] == "2"
    # RocketMQ 4.9.7 sets SUCCESS on these two without clearing the default remark
    assert cq_answer.remark == created.remark == "not set any response code"
    assert created.code == ResponseCode.SUCCESS
    assert (cq["minQueueIndex"], cq["maxQueueIndex"]) == (0, 3)
    assert [row["physicSize"] > 0 for row in cq["queueData"]] == [True, True]
    assert cq["queueData"][0]["physicOffset"] < cq["queueData"][1]["physicOffset"]
    assert (nope.code, nope.remark) == (ResponseCode.SYSTEM_ERROR, f"7@{TOPIC} is not exist!")


def test_namesrv_kv_config_and_write_permission(broker: BrokerProcess) -> None:
    with RawClient(broker.namesrv_addr) as ns:
        put = ns.request(
            RequestCode.PUT_KV_CONFIG,
            {"namespace": "ORDER_TOPIC_CONFIG", "key": TOPIC, "value": "broker-a:2"},
        )
        got = ns.request(
            RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": TOPIC}
        )
        plain = _body(ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}))
        enable = b"orderMessageEnable=true\n"
        assert ns.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=enable).code == 0
        route = _body(ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}))
        disable = b"orderMessageEnable=false\n"
        assert ns.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=disable).code == 0
        absent = ns.request(RequestCode.GET_KV_CONFIG, {"namespace": "NS", "key": "k"})
        wipe = ns.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        wiped = _body(ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}))
        add = ns.request(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        back = _body(ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}))
        assert (
            ns.request(
                RequestCode.DELETE_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": TOPIC}
            ).code
            == 0
        )
        config = ns.request(RequestCode.GET_NAMESRV_CONFIG)
    assert put.code == 0 and got.ext_fields["value"] == "broker-a:2"
    # only with the nameserver's orderMessageEnable, as on RocketMQ 4.9.7 (seen there)
    assert "orderTopicConf" not in plain and route["orderTopicConf"] == "broker-a:2"
    assert (absent.code, absent.remark) == (
        ResponseCode.QUERY_NOT_FOUND,
        "No config item, Namespace: NS Key: k",
    )
    assert int(wipe.ext_fields["wipeTopicCount"]) > 0
    assert wiped["queueDatas"][0]["perm"] == 4 and back["queueDatas"][0]["perm"] == 6
    assert add.ext_fields["addTopicCount"] == wipe.ext_fields["wipeTopicCount"]
    assert f"listenPort={broker.namesrv_addr.rsplit(':', 1)[1]}" in config.body.decode()


def _props(body: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in body.decode().splitlines() if line)


def test_namesrv_config_as_rocketmq_reports_and_updates_it(broker: BrokerProcess) -> None:
    """mqadmin getNamesrvConfig / updateNamesrvConfig, as on RocketMQ 4.9.7 (seen there):
    NamesrvConfig and NettyServerConfig, an unknown key accepted and dropped, a known one
    reported changed and written to configStorePath, the paths refused."""
    with RawClient(broker.namesrv_addr) as ns:
        before = _props(ns.request(RequestCode.GET_NAMESRV_CONFIG).body)
        # values as the typed fields take them: a number that does not parse keeps the
        # old one, a boolean is parseBoolean's
        body = (
            b"serverWorkerThreads=16\nnoSuchKey=1\nserverSelectorThreads=3.5\n"
            b"serverSocketBacklog=notanumber\nclusterTest=maybe\n"
            b"serverPooledByteBufAllocatorEnable=TRUE\n"
        )
        update = ns.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=body)
        after = _props(ns.request(RequestCode.GET_NAMESRV_CONFIG).body)
        path = ns.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"configStorePath=/tmp/x\n")
        ns.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"serverWorkerThreads=8\n")
    port = broker.namesrv_addr.rsplit(":", 1)[1]
    paths = _namesrv_paths(broker)
    assert before == {
        **paths,
        "listenPort": port,
        "productEnvName": "center",
        "clusterTest": "false",
        "orderMessageEnable": "false",
        "serverWorkerThreads": "8",
        "serverCallbackExecutorThreads": "0",
        "serverSelectorThreads": "3",
        "serverOnewaySemaphoreValue": "256",
        "serverAsyncSemaphoreValue": "64",
        "serverChannelMaxIdleTimeSeconds": "120",
        "serverSocketSndBufSize": "0",
        "serverSocketRcvBufSize": "0",
        "writeBufferHighWaterMark": "0",
        "writeBufferLowWaterMark": "0",
        "serverSocketBacklog": "1024",
        "serverPooledByteBufAllocatorEnable": "true",
        "useEpollNativeSelector": "false",
    }
    assert update.code == ResponseCode.SUCCESS
    assert after == {**before, "serverWorkerThreads": "16"}
    assert (path.code, path.remark) == (ResponseCode.NO_PERMISSION, "Can not update config path")
    assert _props(Path(paths["configStorePath"]).read_bytes()) == before


def _namesrv_paths(broker: BrokerProcess) -> dict[str, str]:
    """Where a nameserver keeps its files: idemp's in the store's config/ (and
    ROCKETMQ_HOME when set); RocketMQ's where tests/realbroker.py started it (its home,
    its ``-c`` file, the home's namesrv/)."""
    if isinstance(broker, RealBroker):
        return {
            "rocketmqHome": str(broker.dir),
            "kvConfigPath": str(broker.dir / "namesrv" / "kvConfig.json"),
            "configStorePath": str(broker.dir / "ns.conf"),
        }
    config = broker.store / "config"
    home = {"rocketmqHome": os.environ["ROCKETMQ_HOME"]} if "ROCKETMQ_HOME" in os.environ else {}
    return {
        **home,
        "kvConfigPath": str(config / "kvConfig.json"),
        "configStorePath": str(config / "namesrv.properties"),
    }


def test_disk_ratio_counts_used_over_used_and_usable(monkeypatch: pytest.MonkeyPatch) -> None:
    """UtilAll.getDiskPartitionSpaceUsedPercent, with this machine's figures when RocketMQ
    4.9.7 reported 0.25 (df's Use%) and idemp 0.70 (blocks reserved for root counted as
    used): used = blocks - free, over used + available, rounded up to a hundredth."""
    fake = os.statvfs_result((4096, 4096, 66053021, 59482343, 20027050, 0, 0, 0, 0, 255))
    monkeypatch.setattr(diskguard.os, "statvfs", lambda path: fake)
    assert diskguard.disk_used_ratio(Path("/any")) == 0.25
    exact = os.statvfs_result((4096, 4096, 100, 50, 50, 0, 0, 0, 0, 255))
    monkeypatch.setattr(diskguard.os, "statvfs", lambda path: exact)
    assert diskguard.disk_used_ratio(Path("/any")) == 0.5
    assert repr(diskguard.disk_used_ratio(Path("/any"))) == "0.5"  # as Java prints it


@pytest.mark.idemp_only("a RocketMQ 5 setting and request")
def test_mixed_topics_with_enable_mixed_message_type(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Refused by default (tests/v5/test_bad_input.py, as on RocketMQ 5.3.3); with the
    setting on, created and typed MIXED."""
    broker = make_broker(enableMixedMessageType="true")
    with RawClient(broker.broker_addr) as c:
        created = c.create_topic("MixedTopic", 1, attributes="+message.type=MIXED")
        cfg = _body(c.request(RequestCode.GET_TOPIC_CONFIG, {"topic": "MixedTopic"}))
    assert created.code == ResponseCode.SUCCESS
    assert cfg["attributes"] == {"message.type": "MIXED"}


@pytest.mark.parametrize("enabled", [True, False])
def test_trace_topic_enable_creates_the_trace_topic_at_start(
    enabled: bool, make_broker: Callable[..., BrokerProcess]
) -> None:
    """traceTopicEnable: the broker's own RMQ_SYS_TRACE_TOPIC, one queue, read-write, in
    its topic table (and so in the nameserver's list) from the start."""
    broker = make_broker(traceTopicEnable=str(enabled).lower())
    with RawClient(broker.broker_addr) as c:
        answer = c.request(RequestCode.GET_ALL_TOPIC_CONFIG, {})
    table = loads_fastjson(answer.body)["topicConfigTable"]
    trace = table.get("RMQ_SYS_TRACE_TOPIC")
    if not enabled:
        assert trace is None
        return
    assert trace is not None
    got = (trace["readQueueNums"], trace["writeQueueNums"], trace["perm"], trace["topicSysFlag"])
    assert got == (1, 1, 6, 0)


def test_runtime_info_of_a_store_never_written(make_broker: Callable[..., BrokerProcess]) -> None:
    """No commit log file yet: its minimum offset is -1, its maximum 0 (RocketMQ 4.9.7's
    getMinPhyOffset without a mapped file; seen on a fresh broker's brokerStatus)."""
    with RawClient(make_broker().broker_addr) as c:
        info = _body(c.request(RequestCode.GET_BROKER_RUNTIME_INFO))["table"]
    assert (info["commitLogMinOffset"], info["commitLogMaxOffset"]) == ("-1", "0")


def test_the_topic_list_comes_in_the_order_rocketmqs_nameserver_gives(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """mqadmin topicList prints the set it reads from the answer, so topics of one hash
    bucket print in the order the answer gives them; RocketMQ's nameserver gives them in
    the order they were first registered (SELF_TEST_TOPIC, at start, before AuditLog,
    which shares its bucket). Measured on RocketMQ 4.9.7 with these settings and topics:
    the list below, in this order."""
    broker = make_broker(traceTopicEnable="true", autoCreateTopicEnable="true")
    with RawClient(broker.broker_addr) as c:
        for topic in ("Orders", "Payments", "AuditLog", "T1", "zeta"):
            assert c.create_topic(topic, 4).code == ResponseCode.SUCCESS
    with RawClient(broker.namesrv_addr) as c:
        answer = c.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {})
    assert json.loads(answer.body)["topicList"] == [
        "zeta", "Orders", "BenchmarkTest", "OFFSET_MOVED_EVENT", "Payments", "TBW102",
        "SELF_TEST_TOPIC", "AuditLog", "DefaultCluster", "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRACE_TOPIC", "DefaultCluster_REPLY_TOPIC", "broker-a", "T1",
    ]  # fmt: skip


def test_a_topic_takes_any_queue_counts_as_rocketmqs_does(broker: BrokerProcess) -> None:
    """AdminBrokerProcessor.updateAndCreateTopic sets the counts it is given, unchecked:
    writeQueueNums 0 (how a topic is drained before it is deleted: producers get no
    queue, consumers read on) and 2000 are both taken. A send names a queue below
    max(read, write), as msgCheck allows."""

    def counts(ns: RawClient, topic: str) -> tuple[int, int]:
        (data,) = _body(ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))[
            "queueDatas"
        ]
        return int(data["readQueueNums"]), int(data["writeQueueNums"])

    with RawClient(broker.broker_addr) as c, RawClient(broker.namesrv_addr) as ns:
        assert c.create_topic("TopicDrained", 4).code == 0
        drain = {
            "topic": "TopicDrained",
            "defaultTopic": "TBW102",
            "readQueueNums": 4,
            "writeQueueNums": 0,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
        }
        assert c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, drain).code == 0
        assert counts(ns, "TopicDrained") == (4, 0)
        assert c.send_message("TopicDrained", b"late", queue_id=3).code == 0
        refused = c.send_message("TopicDrained", b"late", queue_id=4)
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert (refused.remark or "").startswith("request queueId[4] is illegal")
        assert c.create_topic("TopicWide", 2000).code == 0
        assert counts(ns, "TopicWide") == (2000, 2000)


def test_a_topic_needs_a_filter_type_rocketmq_knows(broker: BrokerProcess) -> None:
    """CreateTopicRequestHeader.checkFields: topicFilterType must name a TopicFilterType
    (mqadmin and the clients always send one); absent or unknown, nothing is created."""
    with RawClient(broker.broker_addr) as c:
        for given in (None, "BOGUS"):
            ext = {"topic": "TopicNoFilter", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
            if given is not None:
                ext["topicFilterType"] = given
            refused = c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
            assert (refused.code, refused.remark) == (
                ResponseCode.SYSTEM_ERROR,
                "org.apache.rocketmq.remoting.exception.RemotingCommandException: "
                f"topicFilterType = [{given or 'null'}] value invalid, "
                "org.apache.rocketmq.common.protocol.header.CreateTopicRequestHeader"
                ".checkFields(CreateTopicRequestHeader.java:50)",
            )
        assert c.request(RequestCode.GET_ALL_TOPIC_CONFIG, {}).body.count(b"TopicNoFilter") == 0


def test_a_group_config_is_read_as_fastjson_reads_it(broker: BrokerProcess) -> None:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP's body goes through fastjson: a number given as
    text, a fraction, true and null become the int field's value (null: its default), 0
    a false boolean; what fastjson cannot convert is refused, nothing stored. An empty
    group name is taken (mqadmin updateSubGroup -g ""). Measured on RocketMQ 4.9.7."""

    def create(body: dict[str, Any]) -> RemotingCommand:
        return c.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(body).encode()
        )

    taken: list[tuple[dict[str, Any], int, bool]] = [
        ({"groupName": "GrpText", "retryMaxTimes": "3"}, 3, True),
        ({"groupName": "GrpFraction", "retryMaxTimes": 3.7}, 3, True),
        ({"groupName": "GrpTrue", "retryMaxTimes": True}, 1, True),
        ({"groupName": "GrpNull", "retryMaxTimes": None, "consumeEnable": "TRUE"}, 16, True),
        ({"groupName": "GrpZero", "retryMaxTimes": "", "consumeEnable": 0}, 16, False),
        ({"groupName": ""}, 16, True),
    ]
    not_int = "parseInt error, field : retryMaxTimes"
    refused: list[tuple[dict[str, Any], str]] = [
        (
            {"groupName": "GrpYes", "consumeEnable": "yes"},
            "parseBoolean error, field : consumeEnable",
        ),
        ({"groupName": "GrpSpace", "retryMaxTimes": " 4"}, not_int),
        ({"groupName": "GrpBig", "retryMaxTimes": 2**33}, not_int),
    ]
    with RawClient(broker.broker_addr) as c:
        for body, _, _ in taken:
            assert create(body).code == ResponseCode.SUCCESS, body
        for body, words in refused:
            answer = create(body)
            assert answer.code == ResponseCode.SYSTEM_ERROR, body
            assert words in (answer.remark or ""), answer.remark
        table = _body(c.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}))[
            "subscriptionGroupTable"
        ]
    for body, retries, consume in taken:
        stored = table[body["groupName"]]
        assert (stored["retryMaxTimes"], stored["consumeEnable"]) == (retries, consume), body
    assert not {"GrpYes", "GrpSpace", "GrpBig"} & set(table)


def test_add_write_perm_sets_read_write_until_the_topic_registers_again(
    broker: BrokerProcess,
) -> None:
    """RouteInfoManager.operateWritePermOfBroker: addWritePerm sets each of the broker's
    queue data to read+write (6), not back to the topic's own perm; the nameserver keeps
    what wipe or add made of a route until the broker registers that topic again (an
    updateTopic does, for that topic only)."""

    with RawClient(broker.broker_addr) as c, RawClient(broker.namesrv_addr) as ns:
        assert c.create_topic("TopicPermRO", 2, perm=4).code == 0
        assert c.create_topic("TopicPermRW", 2, perm=7).code == 0
        wipe = ns.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert wipe.code == 0
        assert (_route_perm(ns, "TopicPermRO"), _route_perm(ns, "TopicPermRW")) == (4, 5)
        # registered again: its own perm, whatever the wipe made of its route
        assert c.create_topic("TopicPermRW", 2, perm=7).code == 0
        assert _route_perm(ns, "TopicPermRW") == 7
        add = ns.request(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert add.ext_fields["addTopicCount"] == wipe.ext_fields["wipeTopicCount"]
        assert (_route_perm(ns, "TopicPermRO"), _route_perm(ns, "TopicPermRW")) == (6, 6)
        assert c.create_topic("TopicPermRO", 2, perm=4).code == 0
        assert (_route_perm(ns, "TopicPermRO"), _route_perm(ns, "TopicPermRW")) == (4, 6)


def test_a_topic_is_routed_with_its_own_perm_or_a_partial_brokers(
    broker: BrokerProcess,
) -> None:
    """BrokerController.registerBrokerAll: a read-write broker registers each topic's perm
    as it is, odd bits and all; a broker that is not read-write registers its own
    permission for every topic (seen with mqadmin topicRoute on RocketMQ 4.9.7). idemp had
    masked the topic's perm with the broker's."""
    odd = {"TopicPermMinus": -1, "TopicPerm16": 16, "TopicPermW": 2, "TopicPermAll": 7}
    with RawClient(broker.broker_addr) as c, RawClient(broker.namesrv_addr) as ns:
        for topic, perm in odd.items():
            assert c.create_topic(topic, 1, perm=perm).code == 0
        assert {t: _route_perm(ns, t) for t in odd} == odd
        for permission in (4, 2):
            assert c.update_broker_config(brokerPermission=permission).code == 0
            assert {t: _route_perm(ns, t) for t in odd} == dict.fromkeys(odd, permission)
        assert c.update_broker_config(brokerPermission=6).code == 0
        assert {t: _route_perm(ns, t) for t in odd} == odd


def test_route_perms_last_until_the_broker_registers_its_whole_table(
    broker: BrokerProcess,
) -> None:
    """RouteInfoManager.registerBroker rewrites the queue data of every topic a broker
    registers with a newer dataVersion, undoing wipeWritePerm. An updateTopic registers
    its one topic (registerIncrementBrokerData), so the others keep the wipe; an update
    of brokerPermission (with a new version) and a topic created by a send register the
    whole table. idemp had kept the wipe through both."""

    def version(c: RawClient) -> int:
        table = _body(c.request(RequestCode.GET_ALL_TOPIC_CONFIG, {}))
        return int(table["dataVersion"]["counter"])

    def wipe(ns: RawClient) -> None:
        r = ns.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert r.code == ResponseCode.SUCCESS

    with RawClient(broker.broker_addr) as c, RawClient(broker.namesrv_addr) as ns:
        assert c.create_topic("TopicWhole1", 2).code == 0
        wipe(ns)
        assert _route_perm(ns, "TopicWhole1") == 4
        before = version(c)
        assert c.update_broker_config(brokerPermission=6).code == 0
        assert (_route_perm(ns, "TopicWhole1"), version(c)) == (6, before + 1)
        wipe(ns)
        assert c.create_topic("TopicWhole2", 2).code == 0
        assert (_route_perm(ns, "TopicWhole1"), _route_perm(ns, "TopicWhole2")) == (4, 6)
        assert c.send_message("TopicWholeAuto", b"x").code == ResponseCode.SUCCESS
        assert (_route_perm(ns, "TopicWhole1"), _route_perm(ns, "TopicWhole2")) == (6, 6)


def test_broker_consume_stats_lists_groups_in_the_group_tables_order(
    broker: BrokerProcess,
) -> None:
    """fetchAllConsumeStatsInBroker walks the subscription group table, a
    ConcurrentHashMap(1024): mqadmin brokerConsumeStats prints its groups in that
    order, not in the order they were created (seen on RocketMQ 4.9.7)."""
    created = ["GP1", "GH", "Z1", "A1", "M1", "B2", "Q9"]
    with RawClient(broker.broker_addr) as c:
        for group in created:
            assert c.create_group(group).code == 0
        stats = _body(c.request(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"}))
    # among the broker's own groups, as on RocketMQ 4.9.7 (the module's other tests add
    # groups of their own, left out here)
    expected = [
        "A1",
        "B2",
        "SELF_TEST_C_GROUP",
        "GH",
        "M1",
        "CID_ONSAPI_OWNER",
        "Q9",
        "Z1",
        "CID_ONSAPI_PERMISSION",
        "GP1",
        "TOOLS_CONSUMER",
        "CID_ONS-HTTP-PROXY",
        "FILTERSRV_CONSUMER",
        "CID_ONSAPI_PULL",
    ]
    listed = [name for entry in stats["consumeStatsList"] for name in entry]
    assert [name for name in listed if name in expected] == expected


def test_broker_consume_stats_lists_a_groups_topics_in_its_hash_sets_order(
    broker: BrokerProcess,
) -> None:
    """fetchAllConsumeStatsInBroker takes a group's topics from whichTopicByConsumer, a
    HashSet: a group's %RETRY% topic comes before S1 however the offsets were committed
    (seen with the Java client's consumers on RocketMQ 4.9.7)."""
    group = "GC"
    with RawClient(broker.broker_addr) as c:
        assert c.create_group(group).code == 0
        for topic in ("S1", f"%RETRY%{group}"):
            assert c.create_topic(topic, 1).code == 0
            commit = {"consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": 0}
            assert c.request(RequestCode.UPDATE_CONSUMER_OFFSET, commit).code == 0
        stats = _body(c.request(RequestCode.GET_BROKER_CONSUME_STATS, {"isOrder": "false"}))
    (per_topic,) = [entry[group] for entry in stats["consumeStatsList"] if group in entry]
    listed = [{queue["topic"] for queue, _ in s["offsetTable"]} for s in per_topic]
    assert listed == [{f"%RETRY%{group}"}, {"S1"}]


def test_a_reset_pushed_to_consumers_says_is_force_false(broker: BrokerProcess) -> None:
    """Broker2Client.resetOffset builds the consumers' RESET_CONSUMER_CLIENT_OFFSET header
    without setting isForce, so it carries false whatever the admin asked; the C++ client
    reads the field, and its process died on idemp's header, which lacked it."""
    with RawClient(broker.broker_addr) as consumer, RawClient(broker.broker_addr) as admin:
        assert consumer.heartbeat("127.0.0.1@reset-force", ["GResetForce"], topic=TOPIC).code == 0
        _commit_on_both_queues(admin, "GResetForce")
        reset = admin.request(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            {"topic": TOPIC, "group": "GResetForce", "timestamp": 0, "isForce": "true"},
        )
        assert reset.code == ResponseCode.SUCCESS
        pushed = consumer.wait_pushed(
            lambda cmd: cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET, 10
        )
    assert pushed.ext_fields == {
        "topic": TOPIC,
        "group": "GResetForce",
        "timestamp": "0",
        "isForce": "false",
    }


def test_consumer_status_of_a_group_with_no_consumer_online(broker: BrokerProcess) -> None:
    """Broker2Client.getConsumeStatus reads the group's channels without a null check, and
    a group goes with its last connection: an unknown group and one whose consumer left
    both get the NullPointerException's text (Java 17's) and where it was thrown."""
    npe = (
        'java.lang.NullPointerException: Cannot invoke "org.apache.rocketmq.broker.client.'
        'ConsumerGroupInfo.getChannelInfoTable()" because the return value of "org.apache.'
        'rocketmq.broker.client.ConsumerManager.getConsumerGroupInfo(String)" is null, '
        "org.apache.rocketmq.broker.client.net.Broker2Client.getConsumeStatus"
        "(Broker2Client.java:243)"
    )
    with RawClient(broker.broker_addr) as consumer:
        assert consumer.heartbeat("127.0.0.1@status-gone", ["GStatusGone"], topic=TOPIC).code == 0
    with RawClient(broker.broker_addr) as admin:
        for group in ("GStatusNobody", "GStatusGone"):
            deadline = time.monotonic() + 10
            while True:  # the closed connection is noticed by the broker's channel event
                r = admin.request(
                    RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                    {"topic": TOPIC, "group": group},
                )
                if r.remark == npe or time.monotonic() > deadline:
                    break
                time.sleep(0.05)  # polling for the channel's close; bounded by the deadline
            assert (group, r.code, r.remark) == (group, ResponseCode.SYSTEM_ERROR, npe)


def test_clients_are_gated_by_rocketmqs_version_ordinals(broker: BrokerProcess) -> None:
    """AdminBrokerProcessor.callConsumer asks a consumer from V3_1_8_SNAPSHOT (62) on, and
    Broker2Client.resetOffset resets one from V3_0_7_SNAPSHOT (28) on, naming the version
    of one it cannot. idemp had the ordinals as 83 and 59, so it refused the C++ client
    2.0 (63, V3_1_8) running-info and consume-directly requests."""
    group = "GVersionGate"
    for version, asked in ((61, False), (62, True)):
        client_id = f"127.0.0.1@version-{version}"
        with RawClient(broker.broker_addr, version=version) as consumer:
            assert consumer.heartbeat(client_id, [group], topic=TOPIC).code == 0
            with RawClient(broker.broker_addr) as admin:
                ask = {"consumerGroup": group, "clientId": client_id, "jstackEnable": "false"}
                if asked:
                    admin.send(admin.command(RequestCode.GET_CONSUMER_RUNNING_INFO, ask))
                    consumer.wait_pushed(
                        lambda cmd: cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO, 10
                    )
                else:
                    r = admin.request(RequestCode.GET_CONSUMER_RUNNING_INFO, ask)
                    assert (r.code, r.remark) == (
                        ResponseCode.SYSTEM_ERROR,
                        f"The Consumer <{client_id}> Version <V3_1_7> too low to finish, "
                        "please upgrade it to V3_1_8_SNAPSHOT",
                    )
    for version, pushed in ((27, False), (28, True)):
        group = f"GVersionReset{version}"  # a group of its own: no earlier channel in it
        reset = {"topic": TOPIC, "group": group, "timestamp": 0, "isForce": "true"}
        with RawClient(broker.broker_addr, version=version) as consumer:
            assert consumer.heartbeat(f"127.0.0.1@reset-{version}", [group], topic=TOPIC).code == 0
            with RawClient(broker.broker_addr) as admin:
                _commit_on_both_queues(admin, group)
                r = admin.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, reset)
            if pushed:
                assert r.code == ResponseCode.SUCCESS
                consumer.wait_pushed(
                    lambda cmd: cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET, 10
                )
            else:
                assert (r.code, r.remark) == (
                    ResponseCode.SYSTEM_ERROR,
                    "the client does not support this feature. version=V3_0_6",
                )


def test_a_consumer_that_never_answers_is_given_ten_seconds(broker: BrokerProcess) -> None:
    """AdminBrokerProcessor.callConsumer waits Broker2Client.callClient's 10 s for the
    client's answer (the C++ client 2.0 never answers a consume-directly request), then
    answers CONSUME_MSG_TIMEOUT with the RemotingTimeoutException's text and first frame.
    idemp had waited 5 s and written its own exception."""
    client_id = "127.0.0.1@silent"
    with RawClient(broker.broker_addr, language="CPP", version=63) as silent:
        assert silent.heartbeat(client_id, ["GSilent"], topic=TOPIC).code == 0
        stored = silent.send_message(TOPIC, b"direct")
        assert stored.code == ResponseCode.SUCCESS
        local = silent.sock.getsockname()
        with RawClient(broker.broker_addr, timeout=30) as admin:
            started = time.monotonic()
            direct = admin.command(
                RequestCode.CONSUME_MESSAGE_DIRECTLY,
                {"consumerGroup": "GSilent", "clientId": client_id},
            )
            direct.ext_fields["msgId"] = stored.ext_fields["msgId"]
            running = admin.command(
                RequestCode.GET_CONSUMER_RUNNING_INFO,
                {"consumerGroup": "GSilent", "clientId": client_id, "jstackEnable": "false"},
            )
            for request in (direct, running):
                admin.send(request)
            answers = [admin.wait_response(r.opaque, 30) for r in (direct, running)]
            waited = time.monotonic() - started
    timeout = (
        f"consumer <GSilent> <{client_id}> Timeout: org.apache.rocketmq.remoting.exception."
        f"RemotingTimeoutException: wait response on the channel <{local[0]}:{local[1]}> "
        "timeout, 10000(ms), org.apache.rocketmq.remoting.netty.NettyRemotingAbstract."
        "invokeSyncImpl(NettyRemotingAbstract.java:439)"
    )
    assert [(a.code, a.remark) for a in answers] == [
        (ResponseCode.CONSUME_MSG_TIMEOUT, timeout)
    ] * 2
    assert waited >= 10.0  # both asked at once: each waited its full 10 s


def test_the_system_topic_list_comes_in_its_hash_sets_order(broker: BrokerProcess) -> None:
    """TopicValidator's HashSet, filled with its static topics, then the cluster's and
    the broker's names and the reply topic (measured on 4.9.7)."""
    with RawClient(broker.broker_addr) as c:
        answer = c.request(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER, {})
    assert json.loads(answer.body)["topicList"] == [
        "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
        "DefaultCluster_REPLY_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "BenchmarkTest",
        "TRANS_CHECK_MAX_TIME_TOPIC", "OFFSET_MOVED_EVENT", "TBW102", "broker-a",
        "SELF_TEST_TOPIC", "DefaultCluster",
    ]  # fmt: skip


def test_admin_requests_lacking_a_field_go_on_with_it_null(broker: BrokerProcess) -> None:
    """As 4.9.7's header decoding leaves an absent field: a stats name and key that
    read "null", a topic to delete that is blank."""
    with RawClient(broker.broker_addr) as c:
        stats = c.request(RequestCode.VIEW_BROKER_STATS_DATA, {})
        delete = c.request(RequestCode.DELETE_TOPIC_IN_BROKER, {})
    assert (stats.code, stats.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "The stats <null> <null> not exist",
    )
    assert (delete.code, delete.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "The specified topic is blank.",
    )


def test_a_key_query_counts_before_it_adds(broker: BrokerProcess) -> None:
    """IndexFile.selectPhyOffset checks maxNum before it adds a match, so 0 finds
    nothing; IndexService sizes its list by it, so a negative one fails; an absent topic
    is "null" in the index key, which names nothing."""
    now = int(time.time() * 1000) + 60_000
    ext = {"topic": TOPIC, "key": "k1", "beginTimestamp": 0, "endTimestamp": now}
    with RawClient(broker.broker_addr) as c:
        one = c.request(RequestCode.QUERY_MESSAGE, {**ext, "maxNum": 1})
        zero = c.request(RequestCode.QUERY_MESSAGE, {**ext, "maxNum": 0})
        negative = c.request(RequestCode.QUERY_MESSAGE, {**ext, "maxNum": -1})
        no_topic = c.request(
            RequestCode.QUERY_MESSAGE,
            {k: v for k, v in ext.items() if k != "topic"} | {"maxNum": 1},
        )
    assert one.code == ResponseCode.SUCCESS
    not_found = (ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
    assert (zero.code, zero.remark) == not_found
    assert (no_topic.code, no_topic.remark) == not_found
    assert (negative.code, negative.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "java.lang.IllegalArgumentException: Illegal Capacity: -1, "
        "java.base/java.util.ArrayList.<init>(ArrayList.java:160)",
    )
