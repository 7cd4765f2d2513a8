"""The broker on the wire, driven by a raw client (tests/broker/rawclient.py).

These cover what the official C++ wheel never sends or cannot observe: SEND_MESSAGE_V2
and SEND_BATCH_MESSAGE, offset and message look-ups, the PULL status table, long
polling, consumer-group bookkeeping, queue locks, route JSON and generic dispatch.
Section numbers refer to /work/shared/rocketmq-remoting.md.
"""

from __future__ import annotations

import itertools
import json
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess
from idemp.remoting import (
    MessageExt,
    PullSysFlag,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SerializeType,
    decode_message,
    decode_messages,
    decode_properties,
    encode_properties,
    jsonlenient,
    parse_offset_msg_id,
)
from tests.realbroker import broker_of

from .rawclient import RawClient, batch_body

HERE = Path(__file__)  # which suite: IDEMP_4X_REAL swaps this suite's brokers

FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
# How long a test watches for something that must NOT happen (a response to a held
# pull, a notification). Long enough for a loopback round trip many times over.
QUIET_S = 0.3


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module (every test uses its own topics and groups); tests
    that need a special configuration start their own with ``make_broker``."""
    with broker_of(tmp_path_factory.mktemp("protocol") / "store", None, HERE) as b:
        yield b


def _v2_ext(topic: str, queue_id: int, props: dict[str, str], **over: object) -> dict[str, object]:
    ext: dict[str, object] = {
        "a": "PG_V2",
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": queue_id,
        "f": 0,
        "g": 1_700_000_000_123,
        "h": 7,
        "i": encode_properties(props),
        "j": 0,
        "k": "false",
        "l": 16,
        "m": "false",
    }
    ext.update(over)
    return ext


def _msgs(resp_body: bytes) -> list[MessageExt]:
    return decode_messages(resp_body)


# --------------------------------------------------------------------------------------
# sends
# --------------------------------------------------------------------------------------
def test_send_message_v2_with_one_letter_keys(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        props = {"KEYS": "k1 k2", "TAGS": "TagA", "UNIQ_KEY": "U-V2-0", "WAIT": "true"}
        r0 = c.request(RequestCode.SEND_MESSAGE_V2, _v2_ext("TopicV2", 1, props), b"body-0")
        r1 = c.request(
            RequestCode.SEND_MESSAGE_V2,
            _v2_ext("TopicV2", 1, {**props, "UNIQ_KEY": "U-V2-1"}),
            b"body-1",
        )
        assert (r0.code, r1.code) == (0, 0), (r0.remark, r1.remark)
        assert r0.ext_fields["queueId"] == "1" and r1.ext_fields["queueId"] == "1"
        assert (r0.ext_fields["queueOffset"], r1.ext_fields["queueOffset"]) == ("0", "1")
        assert r0.ext_fields["MSG_REGION"] == "DefaultRegion"
        assert r0.ext_fields["TRACE_ON"] == "true"
        host0, phy0 = parse_offset_msg_id(r0.ext_fields["msgId"])
        host1, phy1 = parse_offset_msg_id(r1.ext_fields["msgId"])
        assert host0 == host1 == ("127.0.0.1", broker.broker_port)
        assert phy1 > phy0

        # auto-created from TBW102 with d=4 queues (§4.1)
        with RawClient(broker.namesrv_addr) as ns:
            route = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicV2"})
        assert route.code == 0
        qd = json.loads(route.body)["queueDatas"]
        assert [(q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in qd] == [(4, 4, 6)]

        pulled = c.pull("TopicV2", 1, 0)
        assert pulled.code == 0
        msgs = _msgs(pulled.body)
        assert [m.body for m in msgs] == [b"body-0", b"body-1"]
        assert [m.queue_offset for m in msgs] == [0, 1]
        assert [m.commit_log_offset for m in msgs] == [phy0, phy1]
        m0 = msgs[0]
        assert (m0.topic, m0.queue_id, m0.flag, m0.born_timestamp) == (
            "TopicV2",
            1,
            7,
            1_700_000_000_123,
        )
        assert m0.store_host == ("127.0.0.1", broker.broker_port)
        # CLUSTER added; WAIT is not stored (J 4.9.8, §2.4.1 step 6)
        assert m0.properties == {
            "KEYS": "k1 k2",
            "TAGS": "TagA",
            "UNIQ_KEY": "U-V2-0",
            "CLUSTER": "DefaultCluster",
        }


def test_send_batch_message_stores_each_entry(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicBatch", 2).code == 0
        entries = [(f"b{i}".encode(), {"KEYS": f"k{i}", "UNIQ_KEY": f"U-B-{i}"}) for i in range(3)]
        ext = _v2_ext("TopicBatch", 1, {"OUTER": "o"}, m="true")
        r = c.request(RequestCode.SEND_BATCH_MESSAGE, ext, batch_body(entries))
        assert r.code == 0, r.remark
        ids = r.ext_fields["msgId"].split(",")
        assert len(ids) == 3
        phys = [parse_offset_msg_id(i)[1] for i in ids]
        assert phys == sorted(phys) and len(set(phys)) == 3
        assert (r.ext_fields["queueId"], r.ext_fields["queueOffset"]) == ("1", "0")

        # a second batch continues the queue offsets
        r2 = c.request(
            RequestCode.SEND_BATCH_MESSAGE,
            ext,
            batch_body([(b"b3", {"UNIQ_KEY": "U-B-3"}), (b"b4", {"UNIQ_KEY": "U-B-4"})]),
        )
        assert r2.code == 0 and r2.ext_fields["queueOffset"] == "3"
        assert len(r2.ext_fields["msgId"].split(",")) == 2

        assert c.indexed("TopicBatch", 1, 5) == 5
        msgs = _msgs(c.pull("TopicBatch", 1, 0).body)
        assert [m.queue_offset for m in msgs] == [0, 1, 2, 3, 4]
        assert [m.body for m in msgs] == [b"b0", b"b1", b"b2", b"b3", b"b4"]
        assert [m.commit_log_offset for m in msgs[:3]] == phys
        assert msgs[1].properties == {
            "KEYS": "k1",
            "UNIQ_KEY": "U-B-1",
            "OUTER": "o",
            "CLUSTER": "DefaultCluster",
        }
        # each offsetMsgId leads to its own entry
        for msg_id, body in zip(ids, [b"b0", b"b1", b"b2"]):
            view = c.request(
                RequestCode.VIEW_MESSAGE_BY_ID, {"offset": parse_offset_msg_id(msg_id)[1]}
            )
            assert view.code == 0 and _msgs(view.body)[0].body == body


@pytest.mark.parametrize(
    "code, ext_key",
    [(RequestCode.SEND_MESSAGE, "batch"), (RequestCode.SEND_MESSAGE_V2, "m")],
)
def test_cpp_batch_flag_one_is_not_a_batch(broker: BrokerProcess, code: int, ext_key: str) -> None:
    """The C++ client flags a batch with "1"; Java's Boolean.parseBoolean("1") is false,
    so a real broker stores the whole batch blob as ONE message (§2.4.1)."""
    blob = batch_body([(b"x0", {"UNIQ_KEY": "U-X-0"}), (b"x1", {"UNIQ_KEY": "U-X-1"})])
    topic = f"TopicCppBatch{code}"
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic(topic, 1).code == 0
        if code == RequestCode.SEND_MESSAGE:
            r = c.send_message(topic, blob, {"UNIQ_KEY": "U-OUTER"}, extra={"batch": "1"})
        else:
            ext = _v2_ext(topic, 0, {"UNIQ_KEY": "U-OUTER"}, **{ext_key: "1"})
            r = c.request(code, ext, blob)
        assert r.code == 0, r.remark
        assert "," not in r.ext_fields["msgId"]
        assert r.ext_fields["queueOffset"] == "0"
        assert c.indexed(topic, 0, 1) == 1
        (msg,) = _msgs(c.pull(topic, 0, 0).body)
        assert msg.body == blob
        assert msg.properties == {"UNIQ_KEY": "U-OUTER", "CLUSTER": "DefaultCluster"}


def test_send_batch_code_without_batch_flag_is_a_single_message(broker: BrokerProcess) -> None:
    """Java decides on the header's batch field only, not on the request code."""
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicNoFlag", 1).code == 0
        ext = _v2_ext("TopicNoFlag", 0, {"UNIQ_KEY": "U-NF"})
        del ext["m"]
        r = c.request(RequestCode.SEND_BATCH_MESSAGE, ext, b"plain body, not a batch")
        assert r.code == 0, r.remark
        assert c.indexed("TopicNoFlag", 0, 1) == 1
        (msg,) = _msgs(c.pull("TopicNoFlag", 0, 0).body)
        assert msg.body == b"plain body, not a batch"


# --------------------------------------------------------------------------------------
# offsets and look-ups (§2.4.8, §2.4.10)
# --------------------------------------------------------------------------------------
def _store_times(c: RawClient, topic: str, n: int) -> list[int]:
    """Send ``n`` messages with distinct store timestamps; return them as stored."""
    for i in range(n):
        assert c.send_message(topic, f"t{i}".encode(), {"UNIQ_KEY": f"U-T-{i}"}).code == 0
        # Store timestamps have 1 ms granularity: 15 ms apart keeps them distinct and
        # leaves room for "nearest" probes between them. Not a synchronisation.
        time.sleep(0.015)
    msgs = c.pull_messages(topic)
    assert [m.queue_offset for m in msgs] == list(range(n))
    return [m.store_timestamp for m in msgs]


def test_max_min_offset_and_earliest_store_time(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicOff", 2).code == 0
        ts = _store_times(c, "TopicOff", 3)
        for code, expected in (
            (RequestCode.GET_MAX_OFFSET, "3"),
            (RequestCode.GET_MIN_OFFSET, "0"),
        ):
            r = c.request(code, {"topic": "TopicOff", "queueId": 0})
            assert (r.code, r.ext_fields) == (0, {"offset": expected})
        # unknown queue of a known topic, unknown topic: both 0 (the J store creates an
        # empty consume queue on look-up)
        for topic, qid in (("TopicOff", 1), ("NoSuchTopic", 5)):
            for code in (RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET):
                r = c.request(code, {"topic": topic, "queueId": qid})
                assert (r.code, r.ext_fields) == (0, {"offset": "0"})
        r = c.request(RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": "TopicOff", "queueId": 0})
        assert (r.code, r.ext_fields) == (0, {"timestamp": str(ts[0])})
        r = c.request(RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": "TopicOff", "queueId": 1})
        assert (r.code, r.ext_fields) == (0, {"timestamp": "-1"})


def test_search_offset_by_timestamp(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicTs", 1).code == 0
        t0, t1, t2 = _store_times(c, "TopicTs", 3)
        assert t0 < t1 < t2 and t1 - t0 >= 4

        def search(ts: int, topic: str = "TopicTs") -> int:
            r = c.request(
                RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                {"topic": topic, "queueId": 0, "timestamp": ts},
            )
            assert r.code == 0
            return int(r.ext_fields["offset"])

        mid = t0 + (t1 - t0) // 2  # a tie or nearer t0: Java keeps the earlier entry
        assert [search(t0), search(t1), search(t2)] == [0, 1, 2]  # exact
        assert search(t0 + 1) == 0  # nearest is before
        assert search(t1 - 1) == 1  # nearest is after, not "first >= ts" only by luck
        assert search(mid) == 0
        assert search(mid + 1) == 1
        assert search(t0 - 60_000) == 0  # before everything: the first entry
        assert search(t2 + 60_000) == 2  # past the end: the last entry (max - 1)
        assert search(t1, topic="NoSuchTopic") == 0


def test_a_batch_shares_one_store_time_and_a_search_meets_it_midway(
    broker: BrokerProcess,
) -> None:
    """CommitLog.putMessages stamps a batch once; ConsumeQueue.getOffsetInQueueByTime's
    binary search returns the first entry it meets at the time searched for, here the
    middle one of ten (seen on RocketMQ 4.9.7: 4), not the first."""
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicBatchTs", 1).code == 0
        entries = [(f"s{i}".encode(), {"UNIQ_KEY": f"U-S-{i}"}) for i in range(10)]
        ext = _v2_ext("TopicBatchTs", 0, {}, m="true")
        assert c.request(RequestCode.SEND_BATCH_MESSAGE, ext, batch_body(entries)).code == 0
        assert c.indexed("TopicBatchTs", 0, 10) == 10
        stamps = {m.store_timestamp for m in c.pull_messages("TopicBatchTs")}
        assert len(stamps) == 1
        (t,) = stamps

        def search(ts: int) -> int:
            fields = {"topic": "TopicBatchTs", "queueId": 0, "timestamp": ts}
            r = c.request(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, fields)
            assert r.code == 0
            return int(r.ext_fields["offset"])

        assert [search(t - 1), search(t), search(t + 1)] == [0, 4, 9]


def test_view_message_by_id(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        r0 = c.send_message("TopicView", b"first", {"KEYS": "kv", "UNIQ_KEY": "U-V-0"})
        r1 = c.send_message("TopicView", b"second", {"UNIQ_KEY": "U-V-1"})
        _, phy1 = parse_offset_msg_id(r1.ext_fields["msgId"])
        view = c.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": phy1})
        assert view.code == 0
        (msg,) = _msgs(view.body)
        assert (msg.body, msg.commit_log_offset, msg.topic) == (b"second", phy1, "TopicView")
        assert msg.offset_msg_id == r1.ext_fields["msgId"]
        _, phy0 = parse_offset_msg_id(r0.ext_fields["msgId"])
        for bad in (phy0 + 1, phy1 + 10_000_000, -1):
            r = c.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": bad})
            assert (r.code, r.remark) == (1, f"can not find message by the offset, {bad}")
            assert r.body == b""


def test_query_message_by_key_and_unique_key(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        c.send_message("TopicQ", b"q0", {"KEYS": "order-1", "UNIQ_KEY": "U-Q-0"})
        c.send_message("TopicQ", b"q1", {"KEYS": "order-2 order-1", "UNIQ_KEY": "U-Q-1"})
        c.send_message("TopicQ", b"q2", {"KEYS": "order-2", "UNIQ_KEY": "U-Q-2"})
        last = c.send_message("OtherTopicQ", b"o0", {"KEYS": "order-1", "UNIQ_KEY": "U-Q-3"})
        c.send_message("TopicQ", b"no keys")  # not indexed: the index ends before it
        _, last_phy = parse_offset_msg_id(last.ext_fields["msgId"])
        (last_msg,) = _msgs(c.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": last_phy}).body)

        def query(key: str, topic: str = "TopicQ", **extra: object) -> tuple[int, list[bytes]]:
            ext = {
                "topic": topic,
                "key": key,
                "maxNum": 32,
                "beginTimestamp": 0,
                "endTimestamp": 2**62,
                **extra,
            }
            r = c.request(RequestCode.QUERY_MESSAGE, ext)
            assert set(r.ext_fields) == {"indexLastUpdateTimestamp", "indexLastUpdatePhyoffset"}
            return r.code, [m.body for m in _msgs(r.body)]

        # in store order (DefaultMessageStore.queryMessage sorts the offsets it found;
        # seen against RocketMQ 4.9.7), but with maxNum below the matches the newest are
        # the ones found (its index walks a key's chain backwards)
        assert query("order-1") == (0, [b"q0", b"q1"])
        assert query("order-2") == (0, [b"q1", b"q2"])
        assert query("order-1", topic="OtherTopicQ") == (0, [b"o0"])
        assert query("U-Q-1", _UNIQUE_KEY_QUERY="true") == (0, [b"q1"])
        assert query("order-1", maxNum=1) == (0, [b"q1"])
        r = c.request(
            RequestCode.QUERY_MESSAGE,
            {
                "topic": "TopicQ",
                "key": "nope",
                "maxNum": 32,
                "beginTimestamp": 0,
                "endTimestamp": 2**62,
            },
        )
        assert (r.code, r.remark, r.body) == (
            22,
            "can not find message, maybe time range not correct",
            b"",
        )
        # a time range that excludes the messages finds nothing either
        assert query("order-1", beginTimestamp=0, endTimestamp=1)[0] == 22
        # IndexService.queryOffset: the index's end, the last message it indexed, when
        # something was found (0 when not)
        assert r.ext_fields == {"indexLastUpdateTimestamp": "0", "indexLastUpdatePhyoffset": "0"}
        found = c.request(
            RequestCode.QUERY_MESSAGE,
            {"topic": "TopicQ", "key": "order-2", "maxNum": 32, "beginTimestamp": 0,
             "endTimestamp": 2**62},
        )  # fmt: skip
        assert found.ext_fields == {
            "indexLastUpdateTimestamp": str(last_msg.store_timestamp),
            "indexLastUpdatePhyoffset": str(last_phy),
        }


# --------------------------------------------------------------------------------------
# PULL (§2.4.2, §4.9)
# --------------------------------------------------------------------------------------
@dataclass
class PullTopic:
    name: str
    addr: str

    def connect(self) -> RawClient:
        return RawClient(self.addr)


_pull_topics = itertools.count()


@pytest.fixture
def pull_topic(broker: BrokerProcess) -> PullTopic:
    """A fresh topic: queue 0 holds A, A, B (tags); queue 1 is empty."""
    topic = PullTopic(f"TopicP{next(_pull_topics)}", broker.broker_addr)
    with topic.connect() as c:
        assert c.create_topic(topic.name, 2).code == 0
        for i, tag in enumerate("AAB"):
            assert c.send_message(topic.name, f"p{i}".encode(), {"TAGS": tag}).code == 0
        assert c.indexed(topic.name, 0, 3) == 3
    return topic


def _pull_row(r: RemotingCommand) -> tuple[int, str]:
    return r.code, r.ext_fields.get("nextBeginOffset", "")


def test_pull_status_table(pull_topic: PullTopic) -> None:
    T = pull_topic.name
    with pull_topic.connect() as c:
        found = c.pull(T, 0, 0)
        assert _pull_row(found) == (0, "3") and found.remark == "FOUND"
        assert found.ext_fields == {
            "suggestWhichBrokerId": "0",
            "nextBeginOffset": "3",
            "minOffset": "0",
            "maxOffset": "3",
        }
        assert [m.body for m in _msgs(found.body)] == [b"p0", b"p1", b"p2"]
        one = c.pull(T, 0, 0, max_nums=1)
        assert _pull_row(one) == (0, "1") and len(_msgs(one.body)) == 1
        # tag filter: FOUND skips the non-matching entries; next = offset + scanned
        tagged = c.pull(T, 0, 0, subscription="B")
        assert _pull_row(tagged) == (0, "3")
        assert [m.body for m in _msgs(tagged.body)] == [b"p2"]
        # entries exist but none match
        nomatch = c.pull(T, 0, 0, subscription="C || D")
        assert _pull_row(nomatch) == (20, "3") and nomatch.body == b""
        assert nomatch.remark == "NO_MATCHED_MESSAGE"
        # empty queue: 19 at offset 0, otherwise 21; next 0
        assert _pull_row(c.pull(T, 1, 0)) == (19, "0")
        assert _pull_row(c.pull(T, 1, 5)) == (21, "0")
        # offset == max: 19, next = offset; without the SUSPEND flag it is answered at
        # once although the request allows a 15 s suspension
        t0 = time.monotonic()
        assert _pull_row(c.pull(T, 0, 3, suspend_ms=15000)) == (19, "3")
        assert time.monotonic() - t0 < 1.0
        # offset > max: 21, next = max (J 4.9.4+, [ISSUE #4215])
        assert _pull_row(c.pull(T, 0, 10)) == (21, "3")
        # (offset < min cannot happen: idemp never deletes from a queue)
        # queueId beyond readQueueNums; unknown topic
        bad_q = c.pull(T, 2, 0)
        assert (bad_q.code, bad_q.remark) == (
            1,  # the consumer as Java's InetSocketAddress prints it (RocketMQ 4.9.7, measured)
            f"queueId[2] is illegal, topic:[{T}] topicConfig.readQueueNums:[2] "
            f"consumer:[/{c.local_addr}]",
        )
        unknown = c.pull("NoSuchTopicP", 0, 0)
        assert unknown.code == 17
        assert unknown.remark == f"topic[NoSuchTopicP] not exist, apply first please! {FAQ}"


def _hold_pull_for_b(c: RawClient, topic: str, group: str) -> RemotingCommand:
    """A pull of tag B at queue 0's end (offset 3) that may be held 15 s; sent, and given
    QUIET_S to be held."""
    held = c.command(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": group,
            "topic": topic,
            "queueId": 0,
            "queueOffset": 3,
            "maxMsgNums": 32,
            "sysFlag": PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION,
            "commitOffset": 0,
            "suspendTimeoutMillis": 15000,
            "subscription": "B",
            "subVersion": 0,
        },
    )
    c.send(held)
    c.collect(QUIET_S)
    return held


def test_pull_long_polling_hold_and_wake(pull_topic: PullTopic) -> None:
    T = pull_topic.name
    with pull_topic.connect() as c, pull_topic.connect() as producer:
        held = _hold_pull_for_b(c, T, "G_LP")
        assert held.opaque not in c.responses  # held, not answered with 19
        t_sent = time.monotonic()
        assert producer.send_message(T, b"p3", {"TAGS": "B"}).code == 0
        r = c.wait_response(held.opaque, timeout=5.0)
        assert time.monotonic() - t_sent < 2.0  # woken by the arrival, not the 15 s timer
        assert _pull_row(r) == (0, "4")
        assert [m.body for m in _msgs(r.body)] == [b"p3"]


def test_a_held_pull_is_rerun_within_5_s_once_its_queue_grows_by_any_message(
    pull_topic: PullTopic,
) -> None:
    """A message whose tag the held pull does not match does not wake it on arrival, but
    PullRequestHoldService's check every 5 s re-runs each held pull whose queue has grown
    past it (checkHoldRequest knows no tag, which counts as a match): the consumer hears
    NO_MATCHED_MESSAGE and moves its offset past the message, long before its 15 s are
    up. Seen against RocketMQ 4.9.7; idemp held the pull the whole 15 s."""
    T = pull_topic.name
    with pull_topic.connect() as c, pull_topic.connect() as producer:
        held = _hold_pull_for_b(c, T, "G_LP_TICK")
        assert held.opaque not in c.responses
        t_sent = time.monotonic()
        assert producer.send_message(T, b"p3", {"TAGS": "A"}).code == 0
        r = c.wait_response(held.opaque, timeout=10.0)
        assert time.monotonic() - t_sent < 5.0 + 2.0  # the next check, with room for load
        assert (_pull_row(r), r.remark, r.body) == ((20, "4"), "NO_MATCHED_MESSAGE", b"")


def test_pull_hold_times_out_with_not_found(pull_topic: PullTopic) -> None:
    T = pull_topic.name
    with pull_topic.connect() as c:
        t0 = time.monotonic()
        r = c.pull(
            T,
            0,
            3,
            sys_flag=PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION,
            suspend_ms=800,
            timeout=10.0,
        )
        elapsed = time.monotonic() - t0
        assert _pull_row(r) == (19, "3")
        # not before the suspend; RocketMQ ends an expired hold at its next 5 s check
        # (PullRequestHoldService), idemp at the suspend's end: room for load on top
        assert 0.8 - 0.01 <= elapsed < 0.8 + 5.0 + 2.0


def test_pull_commit_offset_flag_and_consumer_offsets(pull_topic: PullTopic) -> None:
    T = pull_topic.name
    with pull_topic.connect() as c:

        def query(group: str, qid: int = 0, topic: str = "") -> tuple[int, dict[str, str]]:
            r = c.request(
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": topic or T, "queueId": qid},
            )
            return r.code, r.ext_fields

        # no stored offset on a young queue: SUCCESS with 0 (§2.4.3); also unknown queues
        assert query("G_NEW") == (0, {"offset": "0"})
        assert query("G_NEW", qid=1) == (0, {"offset": "0"})
        assert query("G_NEW", topic="NoSuchTopic") == (0, {"offset": "0"})
        r = c.request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "G_NEW", "topic": T, "queueId": 0, "commitOffset": 2},
        )
        assert (r.code, r.ext_fields) == (0, {})
        assert query("G_NEW") == (0, {"offset": "2"})
        # the clients persist offsets oneway: no response, but applied in order
        c.oneway(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": "G_NEW", "topic": T, "queueId": 0, "commitOffset": 3},
        )
        assert query("G_NEW") == (0, {"offset": "3"})
        # PULL with COMMIT_OFFSET stores commitOffset before answering
        pr = c.pull(
            T,
            0,
            1,
            group="G_PULL",
            sys_flag=PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUBSCRIPTION,
            commit_offset=1,
        )
        assert pr.code == 0
        assert query("G_PULL") == (0, {"offset": "1"})
        # without the flag, commitOffset is ignored
        c.pull(T, 0, 2, group="G_PULL2", sys_flag=PullSysFlag.SUBSCRIPTION, commit_offset=2)
        assert query("G_PULL2") == (0, {"offset": "0"})
        assert c.response_counts and max(c.response_counts.values()) == 1


# --------------------------------------------------------------------------------------
# consumer groups (§2.4.4, §2.4.5, §2.4.11)
# --------------------------------------------------------------------------------------
def _is_notify(group: str) -> Callable[[RemotingCommand], bool]:
    def pred(cmd: RemotingCommand) -> bool:
        return (
            cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
            and cmd.ext_fields == {"consumerGroup": group}
            and cmd.is_oneway
            and not cmd.is_response
        )

    return pred


def test_consumer_list_and_ids_changed_notifications(broker: BrokerProcess) -> None:
    g = "G_MEMBERS"
    with RawClient(broker.broker_addr) as a, RawClient(broker.broker_addr) as probe:

        def expect_one_notify(c: RawClient) -> None:
            """Exactly one NOTIFY_CONSUMER_IDS_CHANGED for ``g`` arrives (and no other
            within QUIET_S after it)."""
            c.wait_pushed(_is_notify(g), timeout=5.0)
            c.collect(QUIET_S)
            assert [p for p in c.pushed if _is_notify(g)(p)] == []

        def ids() -> list[str]:
            r = probe.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": g})
            assert r.code == 0, r.remark
            return sorted(json.loads(r.body)["consumerIdList"])

        none = probe.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": g})
        assert (none.code, none.remark, none.body) == (1, f"no consumer for this group, {g}", b"")

        assert a.heartbeat("10.0.0.1@111#DEFAULT", [g]).code == 0
        expect_one_notify(a)  # a new channel changes the group, its first member included
        assert a.heartbeat("10.0.0.1@111#DEFAULT", [g]).code == 0
        a.collect(QUIET_S)
        assert a.pushed == []  # an unchanged heartbeat notifies nobody
        assert ids() == ["10.0.0.1@111#DEFAULT"]

        b = RawClient(broker.broker_addr)
        try:
            # the wheel's id form comes back unchanged
            assert b.heartbeat("4242-127.0.0.1@DEFAULT", [g]).code == 0
            expect_one_notify(a)
            expect_one_notify(b)
            assert ids() == ["10.0.0.1@111#DEFAULT", "4242-127.0.0.1@DEFAULT"]
        finally:
            b.close()
        expect_one_notify(a)  # b's connection closed
        assert ids() == ["10.0.0.1@111#DEFAULT"]

        r = a.request(
            RequestCode.UNREGISTER_CLIENT,
            {"clientID": "10.0.0.1@111#DEFAULT", "consumerGroup": g, "producerGroup": ""},
        )
        assert r.code == 0
        none = probe.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": g})
        assert (none.code, none.remark) == (1, f"no consumer for this group, {g}")
        assert probe.pushed == []  # not a member: never notified


@pytest.mark.parametrize("flag", ["group", "broker"])
def test_notify_consumer_ids_changed_switched_off_by_the_group_or_the_broker(
    make_broker: Callable[..., BrokerProcess], flag: str
) -> None:
    """notifyConsumerIdsChangedEnable: the group's flag silences the notices of a
    heartbeat and an unregister, but a closed connection notifies all the same
    (ConsumerManager.doChannelCloseEvent does not look at it); the broker's silences
    every notice. Seen side by side with the Java client on RocketMQ 4.9.7: with the
    group's flag off, a killed consumer's queues were taken over at once."""
    g = "G_QUIET"
    broker = make_broker(
        **({"notifyConsumerIdsChangedEnable": "false"} if flag == "broker" else {})
    )
    with RawClient(broker.broker_addr) as a:
        if flag == "group":
            assert a.create_group(g, notifyConsumerIdsChangedEnable=False).code == 0
        assert a.heartbeat("10.0.0.1@1#DEFAULT", [g]).code == 0
        b = RawClient(broker.broker_addr)
        try:
            assert b.heartbeat("10.0.0.2@2#DEFAULT", [g]).code == 0
            a.collect(QUIET_S)
            b.collect(QUIET_S)
            assert [p for p in a.pushed + b.pushed if _is_notify(g)(p)] == []
        finally:
            b.close()
        if flag == "group":
            a.wait_pushed(_is_notify(g), timeout=5.0)
        else:
            a.collect(QUIET_S)
            assert [p for p in a.pushed if _is_notify(g)(p)] == []


# --------------------------------------------------------------------------------------
# queue locks (§2.4.6, §4.7)
# --------------------------------------------------------------------------------------
def _mqs(*qids: int) -> list[dict[str, object]]:
    return [{"topic": "TopicL", "brokerName": "broker-a", "queueId": q} for q in qids]


def _lock(c: RawClient, client_id: str, qids: list[int], code: int = 41) -> list[int]:
    body = {"consumerGroup": "G_LOCK", "clientId": client_id, "mqSet": _mqs(*qids)}
    r = c.request(code, body=json.dumps(body).encode())
    assert r.code == 0, r.remark
    if code == RequestCode.UNLOCK_BATCH_MQ:
        assert r.body == b""
        return []
    got = json.loads(r.body)["lockOKMQSet"]
    assert all(m["topic"] == "TopicL" and m["brokerName"] == "broker-a" for m in got)
    return sorted(m["queueId"] for m in got)


def test_lock_and_unlock_batch(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        assert _lock(c, "X", [0, 1]) == [0, 1]
        assert _lock(c, "Y", [1, 2]) == [2]  # 1 is X's and not expired
        assert _lock(c, "X", [0, 1, 2]) == [0, 1]  # renewing; 2 is Y's
        _lock(c, "Y", [0, 1], code=RequestCode.UNLOCK_BATCH_MQ)  # not the holder: no effect
        assert _lock(c, "Y", [0, 1]) == []
        _lock(c, "X", [1], code=RequestCode.UNLOCK_BATCH_MQ)
        assert _lock(c, "Y", [0, 1]) == [1]
        # the wheel sends the body with a trailing newline
        body = json.dumps({"consumerGroup": "G_LOCK", "clientId": "X", "mqSet": _mqs(0)})
        r = c.request(RequestCode.LOCK_BATCH_MQ, body=body.encode() + b"\n")
        assert r.code == 0 and json.loads(r.body)["lockOKMQSet"] == _mqs(0)


def test_lock_held_by_another_is_taken_over_once_expired(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """rocketmq.broker.rebalance.lockMaxLiveTime, shortened to 300 ms."""
    expiry = make_broker(rebalanceLockMaxLiveTime=300)
    with RawClient(expiry.broker_addr) as c:
        # taken before the request: the broker stamps the lock when it serves it, after
        # this and before the reply arrives (timed from the reply, the expiry could look
        # 2 ms early). CLOCK_MONOTONIC is one clock for both processes.
        t_locked = time.monotonic()
        assert _lock(c, "X", [0]) == [0]
        deadline = t_locked + 5.0
        while _lock(c, "Y", [0]) != [0]:
            assert time.monotonic() < deadline, "an expired lock was never taken over"
            time.sleep(0.02)  # polling the lock table; bounded by the deadline
        assert time.monotonic() - t_locked >= 0.3  # not before it expired
        assert _lock(c, "X", [0]) == []  # Y holds it now, fresh


# --------------------------------------------------------------------------------------
# nameserver (§2.3.1)
# --------------------------------------------------------------------------------------
def test_route_json_forms(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicRoute", 3).code == 0
    addr = broker.broker_addr
    with RawClient(broker.namesrv_addr, language="CPP", version=63) as ns:
        old = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicRoute"})
        assert old.code == 0
        assert f'"brokerAddrs":{{0:"{addr}"}}'.encode() in old.body
        with pytest.raises(ValueError):
            json.loads(old.body)
        lenient = jsonlenient.loads(old.body)
        assert lenient["brokerDatas"][0]["brokerName"] == "broker-a"
        asked = ns.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC,
            {"topic": "TopicRoute", "acceptStandardJsonOnly": "true"},
        )
        assert json.loads(asked.body)["brokerDatas"][0]["brokerAddrs"] == {"0": addr}
        new = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicRoute"}, version=401)
        route = json.loads(new.body)
        assert route["brokerDatas"] == [
            {"brokerAddrs": {"0": addr}, "brokerName": "broker-a", "cluster": "DefaultCluster"}
        ]
        assert route["queueDatas"] == [
            {
                "brokerName": "broker-a",
                "perm": 6,
                "readQueueNums": 3,
                "topicSysFlag": 0,
                "writeQueueNums": 3,
            }
        ]
        assert route["filterServerTable"] == {}
        missing = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopicR"})
        assert (missing.code, missing.body) == (17, b"")
        assert missing.remark == (
            "No topic route info in name server for the topic: NoSuchTopicR" + FAQ
        )


# --------------------------------------------------------------------------------------
# generic dispatch (§1.2, §1.5, §1.6)
# --------------------------------------------------------------------------------------
def test_unknown_request_code_is_answered_but_not_when_oneway(broker: BrokerProcess) -> None:
    """RocketMQ 4.9.7's broker answers an unknown code with 3 through its default
    processor, and drops that answer for a oneway request like any other."""
    with RawClient(broker.broker_addr) as c:
        r = c.request(9999, {"x": "y"})
        assert (r.code, r.remark) == (3, " request type 9999 not supported")
        opaque = c.oneway(4321, {})
        # One connection is served in order: had the oneway been answered, that answer
        # would have arrived before this one.
        assert c.max_offset("AnyTopic") == 0
        assert c.response_counts[opaque] == 0


def test_responses_have_flag_bit_0_and_string_ext_fields(broker: BrokerProcess) -> None:
    """Check the raw response headers the codec would otherwise normalise."""
    with RawClient(broker.broker_addr, language="CPP", version=63) as c:
        c.send_message("TopicRawHdr", b"x", {"UNIQ_KEY": "U-RH"})
        c.pull("TopicRawHdr", 0, 0)
        c.pull("TopicRawHdr", 0, 1)
        c.pull("TopicRawHdr", 0, 9)
        c.request(
            RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "G", "topic": "T", "queueId": 0}
        )
        c.request(RequestCode.GET_MAX_OFFSET, {"topic": "TopicRawHdr", "queueId": 0})
        c.request(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            {"topic": "TopicRawHdr", "queueId": 0, "timestamp": 0},
        )
        c.request(RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": "TopicRawHdr", "queueId": 0})
        c.heartbeat("1-127.0.0.1@DEFAULT", ["G_HDR"])
        c.request(RequestCode.SEND_MESSAGE, {})  # a refused request
        c.request(777, {})  # unknown code
        with RawClient(broker.namesrv_addr, language="CPP", version=63) as ns:
            ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicRawHdr"})
            ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopicH"})
            headers = list(c.raw_headers.values()) + list(ns.raw_headers.values())
    assert len(headers) == 13
    for h in headers:
        assert h["flag"] & 1 == 1 and h["flag"] & 2 == 0, h
        assert isinstance(h["code"], int) and isinstance(h["opaque"], int)
        assert all(isinstance(v, str) for v in h.get("extFields", {}).values()), h
    sent = next(h for h in headers if "msgId" in h.get("extFields", {}))
    assert set(sent["extFields"]) >= {"msgId", "queueId", "queueOffset"}


def test_binary_header_request_gets_a_binary_header_response(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        cmd = c.command(RequestCode.GET_MAX_OFFSET, {"topic": "TopicBin", "queueId": 0})
        cmd.serialize_type = SerializeType.ROCKETMQ
        c.send(cmd)
        r = c.wait_response(cmd.opaque)
        assert r.serialize_type == SerializeType.ROCKETMQ
        assert (r.code, r.ext_fields) == (0, {"offset": "0"})


def test_heartbeat_with_newer_sub_version_serves_pulls_without_subscription(
    pull_topic: PullTopic,
) -> None:
    """The Java push consumer raises subVersion in a heartbeat after each rebalance while
    its expression stays ``*``, then pulls without a subscription of its own: RocketMQ
    stores the newer version (ConsumerGroupInfo.updateSubscription) and serves the pull."""
    T, g = pull_topic.name, "G_SUBVER"
    with pull_topic.connect() as c:
        assert c.heartbeat("1-127.0.0.1@DEFAULT", [g], topic=T, sub_version=100).code == 0
        assert c.heartbeat("1-127.0.0.1@DEFAULT", [g], topic=T, sub_version=200).code == 0
        ok = c.pull(T, 0, 0, group=g, sys_flag=0, sub_version=200)
        assert _pull_row(ok) == (0, "3")
        # an older heartbeat does not roll the stored version back
        assert c.heartbeat("1-127.0.0.1@DEFAULT", [g], topic=T, sub_version=150).code == 0
        assert c.pull(T, 0, 0, group=g, sys_flag=0, sub_version=200).code == 0
        # a pull newer than anything heartbeated is refused, as on RocketMQ
        assert c.pull(T, 0, 0, group=g, sys_flag=0, sub_version=201).code == 25
        # a heartbeat that no longer lists the topic drops its subscription
        assert c.heartbeat("1-127.0.0.1@DEFAULT", [g], topic="Other", sub_version=300).code == 0
        gone = c.pull(T, 0, 0, group=g, sys_flag=0, sub_version=200)
        assert gone.code == 24 and "subscription not exist" in (gone.remark or "")


def test_sql92_subscriptions_are_refused_as_rocketmq_refuses_them(pull_topic: PullTopic) -> None:
    """RocketMQ 4.9.7 with enablePropertyFilter=false (its default; idemp serves tags
    only): the Java consumer's CHECK_CLIENT_CONFIG at start, a pull carrying an SQL92
    subscription and a pull under a heartbeated SQL92 subscription are all refused with
    the same remark (seen with the Java client against both brokers), never served as
    if the expression were a tag."""
    T, g = pull_topic.name, "G_SQL92"
    refusal = "The broker does not support consumer to filter message by SQL92"

    def check(expression_type: str) -> RemotingCommand:
        sub = {"topic": T, "subString": "a > 5", "expressionType": expression_type}
        body = {"clientId": "1-127.0.0.1@DEFAULT", "group": g, "subscriptionData": sub}
        return c.request(RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode())

    with pull_topic.connect() as c:
        sql = check("SQL92")
        assert (sql.code, sql.remark) == (1, refusal)
        assert check("TAG").code == 0
        # no body: refused (RocketMQ 4.9.7 fails to read it, SYSTEM_ERROR)
        assert c.request(RequestCode.CHECK_CLIENT_CONFIG).code == ResponseCode.SYSTEM_ERROR
        pulled = c.pull(T, 0, 0, group=g, subscription="a > 5", expression_type="SQL92")
        assert (pulled.code, pulled.remark) == (1, refusal)
        tag = c.pull(T, 0, 0, group=g, subscription="*", expression_type="TAG")
        assert _pull_row(tag) == (0, "3")
        hb = c.heartbeat(
            "1-127.0.0.1@DEFAULT", [g], topic=T, sub_string="a > 5", expression_type="SQL92"
        )
        assert hb.code == 0
        held = c.pull(T, 0, 0, group=g, sys_flag=0, sub_version=1)
        assert (held.code, held.remark) == (1, refusal)
        # mqadmin consumerConnection shows the subscription's type as given
        conns = c.request(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": g})
        table = jsonlenient.loads(conns.body)["subscriptionTable"]
        assert (table[T]["expressionType"], table[T]["subString"]) == ("SQL92", "a > 5")


def test_send_to_a_queue_beyond_the_topic_names_it_as_rocketmq_does(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicBadQueue", 4).code == 0
        r = c.send_message("TopicBadQueue", b"x", queue_id=99)
        assert r.code == 1
        assert r.remark == (
            "request queueId[99] is illegal, TopicConfig [topicName=TopicBadQueue, "
            "readQueueNums=4, writeQueueNums=4, perm=RW-, topicFilterType=SINGLE_TAG, "
            f"topicSysFlag=0, order=false] Producer: {c.local_addr}"
        )


def test_request_reply_pushes_the_reply_to_the_requester_then_stores_it(
    broker: BrokerProcess,
) -> None:
    """ReplyMessageProcessor (what the Java client's ``producer.request`` relies on): a
    reply sent with SEND_REPLY_MESSAGE_V2 is pushed to the producer connection named in
    REPLY_TO_CLIENT as PUSH_REPLY_MESSAGE_TO_CLIENT, answered only once that client
    answered, then stored in the reply topic with its original properties."""
    reply_topic, requester_id = "DefaultCluster_REPLY_TOPIC", "127.0.0.9@Requester"
    props = {
        "MSG_TYPE": "reply",
        "CORRELATION_ID": "corr-1",
        "REPLY_TO_CLIENT": requester_id,
        "TTL": "3000",
    }
    with RawClient(broker.broker_addr) as req, RawClient(broker.broker_addr) as resp:
        assert req.heartbeat(requester_id, producer_groups=["PG_REQUESTER"]).code == 0
        before = resp.max_offset(reply_topic)
        cmd = resp.command(
            RequestCode.SEND_REPLY_MESSAGE_V2, _v2_ext(reply_topic, 0, props), b"pong"
        )
        resp.send(cmd)
        pushed = req.wait_pushed(lambda c: c.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, 5)
        resp.collect(QUIET_S)
        assert cmd.opaque not in resp.responses  # not before the requester has answered
        h = pushed.ext_fields
        assert (h["topic"], h["producerGroup"], h["queueId"], h["flag"]) == (
            reply_topic,
            "PG_V2",
            "0",
            "7",
        )
        assert (h["bornHost"], h["storeHost"]) == (resp.local_addr, broker.broker_addr)
        assert h["bornTimestamp"] == "1700000000123" and int(h["storeTimestamp"]) > 0
        pushed_props = decode_properties(h["properties"])
        assert pushed_props.pop("PUSH_REPLY_TIME").isdigit() and pushed_props == props
        assert pushed.body == b"pong"
        req.send(pushed.response(0))
        answer = resp.wait_response(cmd.opaque)
        assert (answer.code, answer.remark) == (0, None)
        assert (answer.ext_fields["queueId"], answer.ext_fields["queueOffset"]) == (
            "0",
            str(before),
        )
        assert resp.indexed(reply_topic, 0, before + 1) == before + 1
        stored = resp.pull_messages(reply_topic, 0, before)
        assert [(m.body, m.properties, m.offset_msg_id) for m in stored] == [
            (b"pong", props, answer.ext_fields["msgId"])
        ]

        # refused, but stored all the same, as RocketMQ does
        no_target = {k: v for k, v in props.items() if k != "REPLY_TO_CLIENT"}
        for reply_props, remark in [
            (no_target, "reply message properties[REPLY_TO_CLIENT] is null"),
            (
                {**props, "REPLY_TO_CLIENT": "gone@client"},
                "push reply message fail, channel of <gone@client> not found.",
            ),
        ]:
            r = resp.request(
                RequestCode.SEND_REPLY_MESSAGE_V2, _v2_ext(reply_topic, 0, reply_props)
            )
            assert (r.code, r.remark) == (1, remark)
        cmd = resp.command(RequestCode.SEND_REPLY_MESSAGE_V2, _v2_ext(reply_topic, 0, props), b"x")
        resp.send(cmd)
        pushed = req.wait_pushed(lambda c: c.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, 5)
        req.send(pushed.response(1, "no such request"))
        refused = resp.wait_response(cmd.opaque)
        assert (refused.code, refused.remark) == (1, f"push reply message to {requester_id}fail.")
        assert resp.indexed(reply_topic, 0, before + 4) == before + 4


def test_batch_entries_are_stored_with_their_own_text_then_the_batchs(
    broker: BrokerProcess,
) -> None:
    """CommitLog.MessageExtBatchEncoder, seen with the Java client against RocketMQ
    4.9.7: each entry's properties are stored as the sender wrote them (WAIT included),
    then a separator unless the text ends in one (the C++ form does), then the batch's
    own properties with CLUSTER; so a record is as long as RocketMQ's."""

    def entry(body: bytes, text: str) -> bytes:
        props = text.encode()
        size = 20 + len(body) + 2 + len(props)
        return (
            struct.pack(">iiiii", size, 0, 0, 0, len(body))
            + body
            + struct.pack(">h", len(props))
            + props
        )

    java_text = "u\x01v0\x02KEYS\x01k0\x02UNIQ_KEY\x01U-J\x02WAIT\x01true"
    cpp_text = "KEYS\x01k1\x02UNIQ_KEY\x01U-C\x02"
    outer = "WAIT\x01true\x02CLUSTER\x01DefaultCluster"
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicBatchText", 1).code == 0
        ext = _v2_ext("TopicBatchText", 0, {"WAIT": "true"}, m="true")
        body = entry(b"j", java_text) + entry(b"c", cpp_text)
        assert c.request(RequestCode.SEND_BATCH_MESSAGE, ext, body).code == 0
        assert c.indexed("TopicBatchText", 0, 2) == 2
        raw = c.pull("TopicBatchText", 0, 0).body
        first, end = decode_message(raw)
        records = [raw[:end], raw[end:]]
        for rec, inner in zip(records, [java_text + "\x02", cpp_text]):
            # the entry's own text verbatim, then the batch's properties (in the order of
            # Java's HashMap there, CLUSTER before WAIT: the same length either way)
            size = len(inner) + len(outer)
            (props_len,) = struct.unpack_from(">h", rec, len(rec) - size - 2)
            assert props_len == size
            assert rec[len(rec) - size :].startswith(inner.encode())
            tail = rec[len(rec) - size + len(inner) :].decode()
            assert sorted(tail.split("\x02")) == sorted(outer.split("\x02"))
        assert first.properties == {
            "u": "v0",
            "KEYS": "k0",
            "UNIQ_KEY": "U-J",
            "WAIT": "true",
            "CLUSTER": "DefaultCluster",
        }


def test_a_retry_send_past_its_attempts_reaches_the_dlq_after_its_own_delay(
    broker: BrokerProcess,
) -> None:
    """The Java orderly consumer's send-back at its last attempt is a plain send to
    %RETRY%<group> with DELAY = 3 + attempts. RocketMQ 4.9.7 routes it to the DLQ but
    then restores the request's properties, so the DELAY stands: seen against RocketMQ,
    the message sat in SCHEDULE_TOPIC_XXXX's level-5 queue for a minute before it reached
    %DLQ%<group>. Here level 1 (1 s) keeps the test short."""
    group = "G_RETRY_TO_DLQ"
    retry, dlq = f"%RETRY%{group}", f"%DLQ%{group}"
    over = {"reconsumeTimes": 2, "maxReconsumeTimes": 2}
    with RawClient(broker.broker_addr) as c:
        parked = c.max_offset("SCHEDULE_TOPIC_XXXX", 0)  # other tests' level-1 messages
        sent = c.send_message(retry, b"late", {"DELAY": "1", "UNIQ_KEY": "U-DLQ-1"}, extra=over)
        assert sent.code == 0, sent.remark
        assert c.max_offset(dlq) == 0
        assert c.indexed("SCHEDULE_TOPIC_XXXX", 0, parked + 1) == parked + 1
        held = [m for m in c.pull_messages("SCHEDULE_TOPIC_XXXX", 0) if m.uniq_key == "U-DLQ-1"]
        assert [(m.properties["REAL_TOPIC"], m.properties["REAL_QID"]) for m in held] == [
            (dlq, "0")
        ]
        deadline = time.monotonic() + 10
        while c.max_offset(dlq) < 1:
            assert time.monotonic() < deadline, "the delayed message never reached the DLQ"
            time.sleep(0.05)  # polling the DLQ's queue; bounded by the deadline
        (dead,) = c.pull_messages(dlq)
        assert (dead.body, dead.reconsume_times) == (b"late", 2)
        # without a delay it is stored in the DLQ at once
        plain = c.send_message(retry, b"now", {"UNIQ_KEY": "U-DLQ-2"}, extra=over)
        assert plain.code == 0 and c.indexed(dlq, 0, 2) == 2


def test_puts_are_counted_under_the_topic_stored_in_and_a_due_delay_under_its_own(
    broker: BrokerProcess,
) -> None:
    """statsAll's InTPS and 24-hour counts (TOPIC_PUT_NUMS): SendMessageProcessor counts a
    send under the topic the store renamed it to (SCHEDULE_TOPIC_XXXX for a delay, the half
    topic for a half); ScheduleMessageService counts the delayed message under its own
    topic when it is due, with a get of SCHEDULE_TOPIC_XXXX by SCHEDULE_CONSUMER. Seen
    against RocketMQ 4.9.7: before, idemp counted both sends under their own topics and
    the due message not at all."""
    delayed, tx = "TopicStatsDelay", "TopicStatsHalf"

    def view(c: RawClient, name: str, key: str) -> RemotingCommand:
        return c.request(RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key})

    with RawClient(broker.broker_addr) as c:
        for topic in (delayed, tx):
            assert c.create_topic(topic, 1).code == 0
        assert c.send_message(delayed, b"later", {"DELAY": "1"}).code == 0
        half = {"TRAN_MSG": "true", "PGROUP": "PG_STATS_HALF"}
        assert c.send_message(tx, b"half", half).code == 0
        for topic in (delayed, tx):
            r = view(c, "TOPIC_PUT_NUMS", topic)
            assert (r.code, r.remark) == (
                ResponseCode.SYSTEM_ERROR,
                f"The stats <TOPIC_PUT_NUMS> <{topic}> not exist",
            )
        for stored in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC"):
            assert view(c, "TOPIC_PUT_NUMS", stored).code == ResponseCode.SUCCESS
        # level 1 is 1 s; the schedule counts right after its put (RocketMQ: in the put's
        # callback, so the count may trail the message by a moment)
        deadline = time.monotonic() + 10
        while view(c, "TOPIC_PUT_NUMS", delayed).code != ResponseCode.SUCCESS:
            assert time.monotonic() < deadline, "the due message was never counted"
            time.sleep(0.05)  # polling the counter; bounded by the deadline
        assert c.max_offset(delayed) == 1
        due = view(c, "GROUP_GET_NUMS", "SCHEDULE_TOPIC_XXXX@SCHEDULE_CONSUMER")
        assert due.code == ResponseCode.SUCCESS


def test_queue_stats_count_only_the_schedule_topics_queues(broker: BrokerProcess) -> None:
    """BrokerStatsManager's QUEUE_* items (kept with enableDetailStat, on by default):
    SendMessageProcessor counts a queue's put only for SCHEDULE_TOPIC_XXXX (key
    ``topic@queue``, the queue being the level - 1; a delayed send-back's too), and
    ScheduleMessageService a get of that queue by SCHEDULE_CONSUMER when the message is
    due (``topic@queue@group``); no other topic's queues, and no pull, are counted. Seen
    against RocketMQ 4.9.7."""
    topic = "TopicQueueStats"

    def found(c: RawClient, name: str, key: str) -> bool:
        r = c.request(RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": name, "statsKey": key})
        if r.code != ResponseCode.SUCCESS:
            assert r.remark == f"The stats <{name}> <{key}> not exist"
        return r.code == ResponseCode.SUCCESS

    with RawClient(broker.broker_addr) as c:
        assert c.create_topic(topic, 1).code == 0
        now = c.send_message(topic, b"now")
        assert now.code == 0
        assert c.send_message(topic, b"later", {"DELAY": "2"}).code == 0  # 5 s
        back = _send_back(c, now, "GQueueStats", topic)  # a first retry: level 3, queue 2
        assert back.code == ResponseCode.SUCCESS
        assert found(c, "QUEUE_PUT_NUMS", "SCHEDULE_TOPIC_XXXX@2")
        assert found(c, "QUEUE_PUT_NUMS", "SCHEDULE_TOPIC_XXXX@1")
        assert found(c, "QUEUE_PUT_SIZE", "SCHEDULE_TOPIC_XXXX@1")
        assert not found(c, "QUEUE_PUT_NUMS", f"{topic}@0")
        assert not found(c, "QUEUE_GET_NUMS", "SCHEDULE_TOPIC_XXXX@1@SCHEDULE_CONSUMER")
        deadline = time.monotonic() + 15
        while c.max_offset(topic) < 2:
            assert time.monotonic() < deadline, "the delayed message never came due"
            time.sleep(0.1)  # polling the queue; bounded by the deadline
        # RocketMQ counts in the put's callback: the count may trail the message a moment
        while not found(c, "QUEUE_GET_NUMS", "SCHEDULE_TOPIC_XXXX@1@SCHEDULE_CONSUMER"):
            assert time.monotonic() < deadline, "the due message's get was never counted"
            time.sleep(0.05)  # polling the counter; bounded by the deadline
        assert found(c, "QUEUE_GET_SIZE", "SCHEDULE_TOPIC_XXXX@1@SCHEDULE_CONSUMER")
        assert not found(c, "QUEUE_PUT_NUMS", f"{topic}@0")
        pulled = c.pull(topic, 0, 0, group="GQueueStats")
        assert pulled.code == ResponseCode.SUCCESS
        assert not found(c, "QUEUE_GET_NUMS", f"{topic}@0@GQueueStats")


@pytest.mark.idemp_only("departs on purpose: RocketMQ 4.9.7 answers with its JavaCC parser's text")
def test_an_sql92_expression_that_does_not_parse_is_refused_saying_where(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """RocketMQ's answer is its generated parser's ("Encountered "<EOF>" at line 1, column
    3. Was expecting one of: ..."); idemp names the column and what it expected."""
    broker = make_broker(enablePropertyFilter="true")
    answers = {}
    with RawClient(broker.broker_addr) as c:
        for text in ("a >", "a IN (", "a = 'x"):
            sub = {"topic": "T", "subString": text, "expressionType": "SQL92"}
            body = {"clientId": "c", "group": "g", "subscriptionData": sub}
            r = c.request(RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode())
            answers[text] = (r.code, r.remark)
    assert answers == {
        "a >": (23, "invalid SQL92 selector at column 4: expected a value, found end of selector"),
        "a IN (": (
            23,
            "invalid SQL92 selector at column 7: expected a string literal in the IN list, "
            "found end of selector",
        ),
        "a = 'x": (23, "invalid SQL92 selector at column 5: unterminated string literal"),
    }


def test_sql92_filters_when_the_broker_has_enable_property_filter(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """With enablePropertyFilter=true, as RocketMQ 4.9.7 serves it: the start-up check
    compiles the expression; a pull carrying its subscription, or one under a
    heartbeated subscription, gets only the messages whose properties match."""
    broker = make_broker(enablePropertyFilter="true")
    T, g, cid = "TopicSql", "G_SQL", "1-127.0.0.1@SQL"
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic(T, 1).code == 0
        for a, tag in [("3", "A"), ("10", "B"), ("7", "A"), ("x", "A")]:
            assert c.send_message(T, f"a={a}".encode(), {"a": a, "TAGS": tag}).code == 0
        assert c.send_message(T, b"no a", {"TAGS": "A"}).code == 0

        def check(expression_type: str, text: str) -> RemotingCommand:
            sub = {"topic": T, "subString": text, "expressionType": expression_type}
            body = {"clientId": cid, "group": g, "subscriptionData": sub}
            return c.request(RequestCode.CHECK_CLIENT_CONFIG, body=json.dumps(body).encode())

        assert check("SQL92", "a > 5 AND TAGS = 'A'").code == 0
        bad = check("SQL92", "a >")
        assert bad.code == 23 and bad.remark
        unknown = check("GROOVY", "a > 5")
        # the text of the NullPointerException RocketMQ meets, as Java 17 words it
        assert (unknown.code, unknown.remark) == (
            23,
            'Cannot invoke "org.apache.rocketmq.filter.FilterSpi.compile(String)" because the '
            'return value of "org.apache.rocketmq.filter.FilterFactory.get(String)" is null',
        )

        def bodies(r: RemotingCommand) -> list[bytes]:
            assert r.code == 0, (r.code, r.remark)
            return [m.body for m in _msgs(r.body)]

        pulled = c.pull(T, 0, 0, group=g, subscription="a > 5", expression_type="SQL92")
        assert bodies(pulled) == [b"a=10", b"a=7"]
        # one that does not compile filters nothing (RocketMQ's null filter data)
        assert (
            len(bodies(c.pull(T, 0, 0, group=g, subscription="a >", expression_type="SQL92"))) == 5
        )
        empty = c.pull(T, 0, 0, group=g, subscription="", expression_type="SQL92")
        assert (empty.code, empty.remark) == (23, "parse the consumer's subscription failed")

        hb = c.heartbeat(
            cid, [g], topic=T, sub_string="a IS NULL OR a = 'x'", expression_type="SQL92"
        )
        assert hb.code == 0
        assert bodies(c.pull(T, 0, 0, group=g, sys_flag=0, sub_version=1)) == [b"a=x", b"no a"]
        hb = c.heartbeat(
            cid, [g], topic=T, sub_version=2, sub_string="a >", expression_type="SQL92"
        )
        assert hb.code == 0
        missing = c.pull(T, 0, 0, group=g, sys_flag=0, sub_version=2)
        assert (missing.code, missing.remark) == (
            27,
            "The broker's consumer filter data is not exist!Your expression may be wrong!",
        )


def _port_pair() -> int:
    """A free port p whose p - 2 is free as well (the broker binds both at once)."""
    import socket

    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port - 2))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free port p with p - 2 free in 100 tries")


def test_vip_channel_on_listen_port_minus_two_serves_all_but_pulls(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """RocketMQ's fast port (a Java client with vipChannelEnabled, the default up to 4.4,
    sends there): every request of the main port but PULL_MESSAGE, which gets what
    RocketMQ 4.9.7's fast port answered (seen there, port 10909)."""
    broker = make_broker(listenPort=_port_pair(), autoCreateTopicEnable="true")
    host, port = broker.broker_addr.rsplit(":", 1)
    with RawClient(f"{host}:{int(port) - 2}") as fast:
        sent = fast.send_message("VipTopic", b"over the vip channel", {"UNIQ_KEY": "v1"})
        pulled = fast.pull("VipTopic", 0, 0, suspend_ms=0)
    with RawClient(broker.broker_addr) as main:
        [msg] = main.pull_messages("VipTopic", 0, 0)
    assert sent.code == 0 and sent.ext_fields["queueId"] == "0"
    assert (pulled.code, pulled.remark) == (3, " request type 11 not supported")
    assert msg.body == b"over the vip channel"


@pytest.mark.idemp_only("departs on purpose: RocketMQ 4.9.7 fails to start")
def test_a_taken_vip_port_is_a_warning_not_a_failed_start(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Clients use the fast port only when configured to: the broker starts without it."""
    import socket

    port = _port_pair()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port - 2))
        taken.listen()
        broker = make_broker(listenPort=port)
        with RawClient(broker.broker_addr) as main:
            assert main.max_offset("AnyTopic") == 0
    log = broker.log_path.read_text(encoding="utf-8")
    assert (
        f"VIP channel port {port - 2} not opened: error while attempting to bind on address "
        f"('127.0.0.1', {port - 2}): address already in use"
    ) in log


def test_a_broker_without_write_permission_refuses_sends_to_order_topics_only(
    broker: BrokerProcess,
) -> None:
    """AbstractSendMessageProcessor.msgCheck: brokerPermission without write refuses a
    send only when the topic is an order topic (its clients lose the broker from their
    routes, not its sends); a send-back is refused and, without read, a pull. The texts
    name brokerIP1 alone."""
    with RawClient(broker.namesrv_addr) as ns:
        kv = {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicPermOrd", "value": "broker-a:2"}
        assert ns.request(RequestCode.PUT_KV_CONFIG, kv).code == 0
    with RawClient(broker.broker_addr) as c:
        # a topic's creation registers it, and the registration's answer marks the order
        assert c.create_topic("TopicPermOrd", 2).code == 0
        assert c.create_topic("TopicPermPlain", 2).code == 0
        stored = c.send_message("TopicPermPlain", b"m")
        assert stored.code == 0
        try:
            assert c.update_broker_config(brokerPermission=4).code == 0
            assert c.send_message("TopicPermPlain", b"still").code == 0
            refused = c.send_message("TopicPermOrd", b"no")
            assert (refused.code, refused.remark) == (
                ResponseCode.NO_PERMISSION,
                "the broker[127.0.0.1] sending message is forbidden",
            )
            back = _send_back(c, stored, "GPermBack", "TopicPermPlain")
            assert (back.code, back.remark) == (
                ResponseCode.NO_PERMISSION,
                "the broker[127.0.0.1] sending message is forbidden",
            )
            assert c.update_broker_config(brokerPermission=2).code == 0
            pulled = c.pull("TopicPermPlain", 0, 0)
            assert (pulled.code, pulled.remark) == (
                ResponseCode.NO_PERMISSION,
                "the broker[127.0.0.1] pulling message is forbidden",
            )
        finally:
            assert c.update_broker_config(brokerPermission=6).code == 0


def _send_back(c: RawClient, stored: RemotingCommand, group: str, topic: str) -> RemotingCommand:
    return c.request(
        RequestCode.CONSUMER_SEND_MSG_BACK,
        {
            "offset": parse_offset_msg_id(stored.ext_fields["msgId"])[1],
            "group": group,
            "delayLevel": 0,
            "originMsgId": stored.ext_fields["msgId"],
            "originTopic": topic,
            "unitMode": "false",
            "maxReconsumeTimes": 16,
        },
    )


def test_a_send_back_needs_its_retry_topic_writable(broker: BrokerProcess) -> None:
    """consumerSendMsgBack refuses a send-back when the group's retry topic has no write
    perm (before it decides between retry and dead letter), and stores nothing; the Java
    client then sends the message to the retry topic itself, which msgCheck lets through.
    idemp had stored the retry, so a consumer got one delivery more than on RocketMQ
    4.9.7 before its dead letter."""
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicBackPerm", 1).code == 0
        assert c.create_topic("%RETRY%GBackPerm", 1, perm=4).code == 0
        stored = c.send_message("TopicBackPerm", b"m")
        assert stored.code == 0
        back = _send_back(c, stored, "GBackPerm", "TopicBackPerm")
        assert (back.code, back.remark) == (
            ResponseCode.NO_PERMISSION,
            "the topic[%RETRY%GBackPerm] sending message is forbidden",
        )
        assert c.max_offset("%RETRY%GBackPerm") == 0
        fallback = c.send_message("%RETRY%GBackPerm", b"m", queue_id=0)
        assert fallback.code == ResponseCode.SUCCESS


def test_an_unknown_group_is_named_as_rocketmq_names_it(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """Without autoCreateSubscriptionGroup, a send-back and a send to a retry topic for a
    group that does not exist: consumerSendMsgBack and handleRetryAndDLQ put a space
    between the group and the FAQ tip."""
    broker = make_broker(autoCreateSubscriptionGroup="false")
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic("TopicNoGroup", 1).code == 0
        stored = c.send_message("TopicNoGroup", b"m")
        assert stored.code == 0
        back = _send_back(c, stored, "GNoSuchGroup", "TopicNoGroup")
        retry = c.send_message("%RETRY%GNoSuchGroup", b"m", queue_id=0)
    expected = (
        ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
        "subscription group not exist, GNoSuchGroup "
        "\nSee http://rocketmq.apache.org/docs/faq/ for further details.",
    )
    assert (back.code, back.remark) == expected
    assert (retry.code, retry.remark) == expected


def test_a_send_to_a_retry_topic_not_yet_there_creates_it_from_the_default_topic(
    broker: BrokerProcess,
) -> None:
    """msgCheck creates a missing topic from TBW102 first, a retry topic included (so the
    queue a producer picked from TBW102's route exists); only when that fails does a
    retry topic get its own single queue."""
    with RawClient(broker.broker_addr) as c:
        r = c.send_message("%RETRY%GRetryAuto", b"again", queue_id=2)
        assert (r.code, r.ext_fields["queueId"]) == (0, "2")
    with RawClient(broker.namesrv_addr) as ns:
        route = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "%RETRY%GRetryAuto"})
        queues = jsonlenient.loads(route.body)["queueDatas"]
        assert [(q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in queues] == [(4, 4, 6)]


def test_auto_creation_turned_off_at_run_time_keeps_tbw102_and_takes_its_inherit_bit(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """TopicConfigManager.createTopicInSendMessageMethod: with autoCreateTopicEnable
    switched off, TBW102 stays (its route too) but a send naming it sets its perm to
    read+write, without the inherit bit; switched on again, auto-creation still fails,
    until TBW102 is given its perm back. Measured on RocketMQ 4.9.7."""
    broker = make_broker(autoCreateTopicEnable="true")

    def tbw102(c: RawClient) -> tuple[int, int]:
        table = json.loads(c.request(RequestCode.GET_ALL_TOPIC_CONFIG, {}).body)
        perm = table["topicConfigTable"]["TBW102"]["perm"]
        with RawClient(broker.namesrv_addr) as ns:
            route = ns.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
        return perm, route.code

    def send(c: RawClient, topic: str) -> int:
        return c.send_message(topic, b"x", extra={"defaultTopicQueueNums": 4}).code

    with RawClient(broker.broker_addr) as c:
        assert send(c, "AutoBefore") == ResponseCode.SUCCESS
        assert c.update_broker_config(autoCreateTopicEnable="false").code == 0
        assert tbw102(c) == (7, ResponseCode.SUCCESS)
        assert send(c, "AutoOff") == ResponseCode.TOPIC_NOT_EXIST
        assert tbw102(c)[0] == 6
        assert c.update_broker_config(autoCreateTopicEnable="true").code == 0
        assert send(c, "AutoOnAgain") == ResponseCode.TOPIC_NOT_EXIST


def test_a_corrected_offset_is_noted_in_offset_moved_event(pull_topic: PullTopic) -> None:
    """PullMessageProcessor.generateOffsetMovedEvent: each OFFSET_MOVED answer of a
    master stores an event in OFFSET_MOVED_EVENT's queue 0, tagged and keyed by the
    group; a pull that is merely early (NOT_FOUND) stores none."""
    T = pull_topic.name
    with pull_topic.connect() as c:
        before = c.max_offset("OFFSET_MOVED_EVENT")
        assert _pull_row(c.pull(T, 0, 3, group="GMovedEarly")) == (19, "3")
        moved = c.pull(T, 0, 100, group="GMoved")
        assert _pull_row(moved) == (ResponseCode.PULL_OFFSET_MOVED, "3")
        assert c.indexed("OFFSET_MOVED_EVENT", 0, before + 1) == before + 1
        (event,) = c.pull_messages("OFFSET_MOVED_EVENT", 0, before)
    assert json.loads(event.body) == {
        "consumerGroup": "GMoved",
        "messageQueue": {"brokerName": "broker-a", "queueId": 0, "topic": T},
        "offsetNew": 3,
        "offsetRequest": 100,
    }
    assert event.properties == {"KEYS": "GMoved", "DELAY": "0", "TAGS": "GMoved"}
    assert list(event.properties) == ["KEYS", "DELAY", "TAGS"]  # a HashMap's order
    assert (event.born_host, event.store_host) == (event.store_host, event.store_host)


def test_a_multi_tag_topics_messages_are_stored_with_the_multi_tags_flag(
    broker: BrokerProcess,
) -> None:
    """SendMessageProcessor: a topic whose filter type is MULTI_TAG adds
    MULTI_TAGS_FLAG (2) to each message's sysFlag, single or batch."""
    with RawClient(broker.broker_addr) as c:
        ext = {
            "topic": "TopicMultiTag",
            "defaultTopic": "TBW102",
            "readQueueNums": 1,
            "writeQueueNums": 1,
            "perm": 6,
            "topicFilterType": "MULTI_TAG",
        }
        assert c.request(RequestCode.UPDATE_AND_CREATE_TOPIC, ext).code == 0
        assert c.send_message("TopicMultiTag", b"m", {"TAGS": "a"}).code == 0
        batch = c.request(
            RequestCode.SEND_BATCH_MESSAGE,
            _v2_ext("TopicMultiTag", 0, {}, m="true"),
            batch_body([(b"b", {"UNIQ_KEY": "U-MT-1"})]),
        )
        assert batch.code == 0, batch.remark
        assert c.indexed("TopicMultiTag", 0, 2) == 2
        assert [(m.body, m.sys_flag) for m in c.pull_messages("TopicMultiTag")] == [
            (b"m", 2),
            (b"b", 2),
        ]


def test_an_unregistration_creates_the_consumers_group(broker: BrokerProcess) -> None:
    """ClientManageProcessor.unregisterClient looks the group up with
    findSubscriptionGroupConfig, which creates it (autoCreateSubscriptionGroup): a pull
    consumer that leaves before its first heartbeat leaves its group behind."""
    with RawClient(broker.broker_addr) as c:
        r = c.request(
            RequestCode.UNREGISTER_CLIENT,
            {"clientID": "127.0.0.1@gone", "consumerGroup": "GLeftEarly"},
        )
        assert (r.code, r.remark) == (0, None)
        groups = c.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        table = jsonlenient.loads(groups.body)["subscriptionGroupTable"]
    assert table["GLeftEarly"]["groupName"] == "GLeftEarly"


def test_query_message_compares_times_in_whole_seconds_of_the_index(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    """IndexFile keeps each entry's time as whole seconds since the store time of the
    first message it indexed, and selectPhyOffset compares the range with that: a
    message stored a moment after the first reads as stored with it (seen on RocketMQ
    4.9.7: a range ending just before it still finds it, one starting at it does not).
    A broker of its own: its first indexed message is the test's."""
    broker = make_broker()
    with RawClient(broker.broker_addr) as c:
        assert c.send_message("TopicQT", b"a", {"KEYS": "kt", "UNIQ_KEY": "U-QT-A"}).code == 0
        time.sleep(0.005)  # a later millisecond for the second, well within one second
        assert c.send_message("TopicQT", b"b", {"KEYS": "kt", "UNIQ_KEY": "U-QT-B"}).code == 0
        assert c.indexed("TopicQT", 0, 2) == 2
        first, second = (m.store_timestamp for m in c.pull_messages("TopicQT"))
        assert second > first

        def query(begin: int, end: int) -> tuple[int, list[bytes]]:
            ext = {"topic": "TopicQT", "key": "kt", "maxNum": 32}
            r = c.request(
                RequestCode.QUERY_MESSAGE, {**ext, "beginTimestamp": begin, "endTimestamp": end}
            )
            return r.code, [m.body for m in _msgs(r.body)]

        read_as = first + (second - first) // 1000 * 1000  # the second's time in the index
        found_before = [b"a", b"b"] if read_as < second else [b"a"]
        assert query(first, second - 1) == (0, found_before)
        if read_as < second:
            assert query(second, second + 5000) == (ResponseCode.QUERY_NOT_FOUND, [])
        else:  # the two a whole number of seconds apart: the index has the exact time
            assert query(second, second + 5000) == (0, [b"b"])
