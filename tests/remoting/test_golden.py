"""The codec against a real exchange: C++ client <-> RocketMQ 4.9.7 (tests/remoting/data)."""

from __future__ import annotations

import json
import random
import struct
from typing import Any

import pytest

from idemp.remoting import (
    FrameDecoder,
    RemotingCommand,
    decode_message,
    decode_messages,
    decode_properties,
    encode_message,
    java_string_hash,
    jsonlenient,
    offset_msg_id,
    parse_offset_msg_id,
    tags_code,
)

from .golden import FRAMES, body, is_message_body, wire

STORE = ("127.0.0.1", 10911)
BORN = ("127.0.0.1", 56192)


def expected_ext(header: dict[str, Any]) -> dict[str, str]:
    """C++ sends some extFields as JSON numbers; decoded, every value is a string."""
    ext = header.get("extFields") or {}
    assert all(type(v) in (str, int) for v in ext.values())
    return {k: v if isinstance(v, str) else str(v) for k, v in ext.items()}


def assert_matches(cmd: RemotingCommand, frame: dict[str, Any]) -> None:
    h = frame["header"]
    assert cmd.code == h["code"]
    assert cmd.opaque == h["opaque"]
    assert cmd.flag == h["flag"]
    assert cmd.language == h["language"]
    assert cmd.version == h["version"]
    assert cmd.remark == h.get("remark")
    assert cmd.ext_fields == expected_ext(h)
    assert all(type(v) is str for v in cmd.ext_fields.values())
    assert cmd.body == body(frame)
    assert cmd.serialize_type == frame["serType"] == 0


def test_capture_shape() -> None:
    assert len(FRAMES) == 184
    assert sum(is_message_body(f) for f in FRAMES) == 11
    assert all(len(body(f)) == f["body_len"] for f in FRAMES)


@pytest.mark.parametrize("index", range(len(FRAMES)))
def test_golden_frame_decodes_in_any_chunking(index: int) -> None:
    frame = FRAMES[index]
    data = wire(frame)

    dec = FrameDecoder()
    for i in range(len(data) - 1):
        assert dec.feed(data[i : i + 1]) == []
    assert dec.buffered == len(data) - 1
    (cmd,) = dec.feed(data[-1:])
    assert dec.buffered == 0
    assert_matches(cmd, frame)

    rng = random.Random(index)
    for _ in range(5):
        dec = FrameDecoder()
        got: list[RemotingCommand] = []
        pos = 0
        while pos < len(data):
            step = rng.randint(1, max(1, len(data) // 3))
            got += dec.feed(data[pos : pos + step])
            pos += step
        assert len(got) == 1 and dec.buffered == 0
        assert_matches(got[0], frame)


def test_golden_connections_as_streams() -> None:
    """Each direction of each TCP connection, replayed as one stream in random chunks."""
    streams: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for f in FRAMES:
        streams.setdefault((f["conn"], f["direction"]), []).append(f)
    assert len(streams) == 6
    rng = random.Random(97)
    for frames in streams.values():
        data = b"".join(wire(f) for f in frames)
        dec = FrameDecoder()
        got: list[RemotingCommand] = []
        pos = 0
        while pos < len(data):
            step = rng.choice((1, 2, 3, 7, 64, 500, 4096))
            got += dec.feed(data[pos : pos + step])
            pos += step
        assert dec.buffered == 0
        assert len(got) == len(frames)
        for cmd, f in zip(got, frames):
            assert_matches(cmd, f)


def _decode(index: int) -> RemotingCommand:
    (cmd,) = FrameDecoder().feed(wire(FRAMES[index]))
    return cmd


def test_golden_cpp_send_request_spot_check() -> None:
    cmd = _decode(6)
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.language, cmd.version) == (10, 2, 0, "CPP", 63)
    assert cmd.remark == ""
    assert not cmd.is_response and not cmd.is_oneway
    # numbers on the wire, strings after decoding
    assert cmd.ext_fields["queueId"] == "0"
    assert cmd.ext_fields["defaultTopicQueueNums"] == "4"
    assert cmd.ext_fields["sysFlag"] == "0"
    assert cmd.ext_fields["flag"] == "0"
    assert cmd.ext_fields["bornTimestamp"] == "1795332938002"
    assert cmd.field_int("queueId") == 0
    assert cmd.field_bool("unitMode") is False
    assert decode_properties(cmd.ext_fields["properties"]) == {
        "KEYS": "K0",
        "TAGS": "TagA",
        "UNIQ_KEY": "0100007F0000555E000092FB23730100",
        "WAIT": "true",
        "myprop": "v0",
    }
    assert cmd.body == b"hello golden 0"


def test_golden_broker_responses_spot_check() -> None:
    send_resp = _decode(8)
    assert send_resp.is_response and send_resp.language == "JAVA" and send_resp.version == 407
    assert send_resp.remark is None
    assert send_resp.ext_fields == {
        "queueId": "0",
        "TRACE_ON": "true",
        "MSG_REGION": "DefaultRegion",
        "msgId": "7F00000100002A9F0000000000000000",
        "queueOffset": "0",
    }
    not_exist = _decode(3)
    assert (not_exist.code, not_exist.flag, not_exist.opaque) == (17, 1, 0)
    assert not_exist.ext_fields == {}
    assert not_exist.remark == (
        "No topic route info in name server for the topic: GoldenTopic\n"
        "See http://rocketmq.apache.org/docs/faq/ for further details."
    )
    pull = _decode(44)
    assert (pull.code, pull.opaque, pull.remark) == (0, 15, "FOUND")
    assert pull.ext_fields == {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": "1",
        "maxOffset": "1",
        "minOffset": "0",
    }
    check = _decode(71)
    assert (check.code, check.flag) == (39, 2)
    assert check.is_oneway and not check.is_response


# --- message bodies --------------------------------------------------------------------

U_K0 = "0100007F0000555E000092FB23730100"
U_K1 = "0100007F0000555E000003FC23730200"
U_K2 = "0100007F0000555E000009FC23730300"
U_KORD = "0100007F0000555E00000EFC23730400"
U_KDELAY = "0100007F0000555E000015FC23730500"
U_KTX = "0100007F0000555E0000D1FC23730600"


def _plain(key: str, prop: str, uniq: str, tag: str) -> dict[str, str]:
    return {"myprop": prop, "KEYS": key, "UNIQ_KEY": uniq, "CLUSTER": "DefaultCluster", "TAGS": tag}


def _tx(wait: str) -> dict[str, str]:
    return {
        "REAL_TOPIC": "GoldenTopic",
        "myprop": "tx",
        "TRANSACTION_CHECK_TIMES": "1",
        "KEYS": "KTX",
        "TRAN_MSG": "true",
        "UNIQ_KEY": U_KTX,
        "CLUSTER": "DefaultCluster",
        "PGROUP": "GoldenTxGroup",
        "WAIT": wait,
        "TAGS": "TagT",
        "REAL_QID": "0",
    }


def _retry(prop: str, origin: str, key: str, uniq: str, tag: str) -> dict[str, str]:
    return {
        "REAL_TOPIC": "%RETRY%GoldenConsumerGroup",
        "myprop": prop,
        "ORIGIN_MESSAGE_ID": origin,
        "RETRY_TOPIC": "GoldenTopic",
        "KEYS": key,
        "UNIQ_KEY": uniq,
        "CLUSTER": "DefaultCluster",
        "WAIT": "false",
        "DELAY": "3",
        "TAGS": tag,
        "REAL_QID": "0",
    }


# name: (topic, body, queueId, queueOffset, commitLogOffset, reconsumeTimes, sysFlag,
#        preparedTransactionOffset, bornTimestamp, storeTimestamp, properties)
T = "GoldenTopic"
R = "%RETRY%GoldenConsumerGroup"
MESSAGES: dict[str, tuple[Any, ...]] = {
    "K0": (
        T,
        b"hello golden 0",
        0,
        0,
        0,
        0,
        0,
        0,
        1795332938002,
        1795332938042,
        _plain("K0", "v0", U_K0, "TagA"),
    ),
    "K1": (
        T,
        b"hello golden 1",
        1,
        0,
        208,
        0,
        0,
        0,
        1795332938115,
        1795332938118,
        _plain("K1", "v1", U_K1, "TagA"),
    ),
    "K2": (
        T,
        b"hello golden 2",
        2,
        0,
        416,
        0,
        0,
        0,
        1795332938121,
        1795332938123,
        _plain("K2", "v2", U_K2, "TagA"),
    ),
    "KORD": (
        T,
        b"orderly golden",
        1,
        1,
        624,
        0,
        0,
        0,
        1795332938126,
        1795332938131,
        _plain("KORD", "ord", U_KORD, "TagO"),
    ),
    "KTX_HALF": (T, b"tx golden", 0, 1, 2114, 0, 0, 0, 1795332938321, 1795332938324, _tx("false")),
    "KTX": (T, b"tx golden", 0, 1, 2436, 0, 8, 2114, 1795332938321, 1795332942448, _tx("true")),
    "KDELAY": (
        T,
        b"delayed golden",
        3,
        0,
        2880,
        0,
        0,
        0,
        1795332938133,
        1795332943141,
        {
            "REAL_TOPIC": "GoldenTopic",
            "KEYS": "KDELAY",
            "UNIQ_KEY": U_KDELAY,
            "CLUSTER": "DefaultCluster",
            "DELAY": "2",
            "WAIT": "true",
            "TAGS": "TagD",
            "REAL_QID": "3",
        },
    ),
    "RETRY_K1": (
        R,
        b"hello golden 1",
        0,
        0,
        3134,
        1,
        0,
        0,
        1795332938115,
        1795332948345,
        _retry("v1", "7F00000100002A9F00000000000000D0", "K1", U_K1, "TagA"),
    ),
    "RETRY_KORD": (
        R,
        b"orderly golden",
        0,
        1,
        3500,
        1,
        0,
        0,
        1795332938126,
        1795332948346,
        _retry("ord", "7F00000100002A9F0000000000000270", "KORD", U_KORD, "TagO"),
    ),
}
BODIES = {
    40: ["K2"],
    42: ["K1", "KORD"],
    44: ["K0"],
    71: ["KTX_HALF"],
    73: ["KTX"],
    76: ["KDELAY"],
    140: ["K1", "KORD"],
    142: ["K0", "KTX"],
    148: ["K2"],
    150: ["KDELAY"],
    152: ["RETRY_K1", "RETRY_KORD"],
}


def test_message_bodies_are_where_expected() -> None:
    assert {i for i, f in enumerate(FRAMES) if is_message_body(f)} == set(BODIES)


@pytest.mark.parametrize("index", sorted(BODIES))
def test_golden_messages_decode(index: int) -> None:
    msgs = decode_messages(body(FRAMES[index]))
    assert len(msgs) == len(BODIES[index])
    for msg, name in zip(msgs, BODIES[index]):
        topic, data, qid, qoff, phy, recon, sysflag, prep, born_ts, store_ts, props = MESSAGES[name]
        assert msg.topic == topic
        assert msg.body == data
        assert msg.queue_id == qid
        assert msg.queue_offset == qoff
        assert msg.commit_log_offset == phy
        assert msg.reconsume_times == recon
        assert msg.sys_flag == sysflag
        assert msg.prepared_transaction_offset == prep
        assert msg.born_timestamp == born_ts
        assert msg.store_timestamp == store_ts
        assert msg.properties == props
        assert msg.flag == 0
        assert msg.born_host == BORN
        assert msg.store_host == STORE
        assert msg.tags == props["TAGS"]
        assert msg.keys == [props["KEYS"]]
        assert msg.msg_id == msg.uniq_key == props["UNIQ_KEY"]


def test_golden_messages_agree_with_their_send_requests(
    send_requests: dict[str, dict[str, Any]],
) -> None:
    """Body, born timestamp and user properties survive the broker unchanged."""
    seen = set()
    for index in BODIES:
        for msg in decode_messages(body(FRAMES[index])):
            sent = send_requests[msg.properties["UNIQ_KEY"]]
            req = sent["header"]["extFields"]
            assert msg.body == body(sent)
            assert msg.born_timestamp == int(req["bornTimestamp"])
            sent_props = decode_properties(req["properties"])
            for key in ("KEYS", "TAGS", "myprop"):
                assert msg.properties.get(key) == sent_props.get(key)
            if not msg.topic.startswith("%RETRY%"):  # a retry carries its own DELAY
                assert msg.properties.get("DELAY") == sent_props.get("DELAY")
            seen.add(msg.properties["KEYS"])
    assert seen == {"K0", "K1", "K2", "KORD", "KTX", "KDELAY"}


def _records(raw: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(raw):
        _, end = decode_message(raw, pos)
        out.append(raw[pos:end])
        pos = end
    return out


@pytest.mark.parametrize("index", sorted(BODIES))
def test_golden_messages_reencode_byte_for_byte(index: int) -> None:
    records = _records(body(FRAMES[index]))
    assert b"".join(records) == body(FRAMES[index])
    for rec in records:
        msg, _ = decode_message(rec)
        # The Java 4.9.7 broker stores properties without a trailing \x02, and so does
        # idemp's broker: its default form is the record itself, byte for byte.
        java_text = "\x02".join(f"{k}\x01{v}" for k, v in msg.properties.items()).encode()
        assert rec.endswith(struct.pack(">h", len(java_text)) + java_text)
        assert encode_message(msg) == rec
        assert encode_message(msg, properties_text=java_text.decode()) == rec


def test_offset_msg_ids_equal_send_responses(send_msg_ids: dict[str, str]) -> None:
    assert len(send_msg_ids) == 6
    for msg_id in send_msg_ids.values():
        assert parse_offset_msg_id(msg_id)[0] == STORE
    checked = set()
    for index in BODIES:
        for msg in decode_messages(body(FRAMES[index])):
            uniq = msg.properties["UNIQ_KEY"]
            if "REAL_TOPIC" not in msg.properties:  # stored where it was sent
                assert msg.offset_msg_id == send_msg_ids[uniq]
                assert offset_msg_id(msg.store_host, msg.commit_log_offset) == send_msg_ids[uniq]
                checked.add(uniq)
            elif msg.topic.startswith("%RETRY%"):
                assert msg.properties["ORIGIN_MESSAGE_ID"] == send_msg_ids[uniq]
    assert checked == {U_K0, U_K1, U_K2, U_KORD}
    # The half message's offset is what the first END_TRANSACTION reports.
    assert parse_offset_msg_id(send_msg_ids[U_KTX]) == (STORE, 1818)
    assert FRAMES[61]["header"]["extFields"]["commitLogOffset"] == "1818"


def test_check_transaction_state_body() -> None:
    check = _decode(71)
    (msg,) = decode_messages(check.body)
    assert msg.offset_msg_id == check.ext_fields["offsetMsgId"]
    assert msg.offset_msg_id == "7F00000100002A9F0000000000000842"
    assert msg.commit_log_offset == int(check.ext_fields["commitLogOffset"]) == 2114
    assert msg.uniq_key == check.ext_fields["transactionId"] == check.ext_fields["msgId"]
    assert msg.properties["TRAN_MSG"] == "true"
    assert msg.properties["PGROUP"] == "GoldenTxGroup"
    assert msg.body == b"tx golden"
    # The committed copy points back at the half message.
    (committed,) = decode_messages(body(FRAMES[73]))
    assert committed.prepared_transaction_offset == msg.commit_log_offset


# --- JSON bodies -------------------------------------------------------------------------

ROUTE_FRAMES = [5, 20, 49, 64, 66, 68, 70]


def test_route_bodies_parse_leniently() -> None:
    assert [i for i, f in enumerate(FRAMES) if f.get("body_json_strict") is False] == ROUTE_FRAMES
    for index in ROUTE_FRAMES:
        text = body(FRAMES[index]).decode()
        with pytest.raises(ValueError):
            json.loads(text)
        assert text.count("{0:") == 1
        assert jsonlenient.loads(text) == json.loads(text.replace("{0:", '{"0":'))
        assert jsonlenient.loads(body(FRAMES[index])) == jsonlenient.loads(text)
    assert jsonlenient.loads(body(FRAMES[5])) == {
        "brokerDatas": [
            {
                "brokerAddrs": {"0": "127.0.0.1:10911"},
                "brokerName": "broker-a",
                "cluster": "DefaultCluster",
            }
        ],
        "filterServerTable": {},
        "queueDatas": [
            {
                "brokerName": "broker-a",
                "perm": 7,
                "readQueueNums": 8,
                "topicSysFlag": 0,
                "writeQueueNums": 8,
            }
        ],
    }


def test_strict_json_bodies_parse_identically() -> None:
    strict = [f for f in FRAMES if f.get("body_json_strict") is True]
    assert len(strict) == 25
    for f in strict:
        raw = body(f)
        assert jsonlenient.loads(raw) == json.loads(raw)


def test_heartbeat_body() -> None:
    hb = _decode(21)
    assert hb.code == 34
    assert hb.body.endswith(b"}\n")
    data = jsonlenient.loads(hb.body)
    assert data["clientID"] == "1842-127.0.0.1@DEFAULT"
    assert data["producerDataSet"] == [{"groupName": "GoldenProducerGroup"}]
    (consumer,) = data["consumerDataSet"]
    assert consumer["groupName"] == "GoldenConsumerGroup"
    assert [s["topic"] for s in consumer["subscriptionDataSet"]] == [
        "%RETRY%GoldenConsumerGroup",
        "GoldenTopic",
    ]


def test_java_string_hash_of_golden_tag() -> None:
    # By hand, h = 31*h + c over "TagA" (T=84, a=97, g=103, A=65):
    #   84 -> 84*31+97 = 2701 -> 2701*31+103 = 83834 -> 83834*31+65 = 2598919
    assert java_string_hash("TagA") == 2598919
    assert tags_code("TagA") == 2598919
    assert tags_code(None) == 0 and tags_code("") == 0
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    # Famous Java overflow case: "polygenelubricants".hashCode() == Integer.MIN_VALUE
    assert java_string_hash("polygenelubricants") == -(2**31)
    # Outside the BMP Java hashes the two UTF-16 surrogates: 31*0xD83D + 0xDE00
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00 == 1772899
