"""The nameserver's table of registered brokers and REGISTER_BROKER's body: pure logic,
checked against RocketMQ 4.9.7's RouteInfoManager rules and a body its broker sent."""

from __future__ import annotations

import base64

import pytest

from idemp.broker.registration import (
    RegisterBodyError,
    body_crc32,
    decode_register_body,
    encode_register_body,
)
from idemp.broker.routes import EXPIRY_S, RouteTable

# REGISTER_BROKER's body from a RocketMQ 4.9.7 broker with compressedRegister=true
# (broker-c, a fresh store; its header said bodyCrc32=940511102)
REAL_COMPRESSED = base64.b64decode(
    "eNpjYGBQr1ZKzi/NK0ktUrIy0FEqycxNLS5JzC1QsjI0tzS1MDUxMzU0sTCrZWBg4ARitWBnD1eXUB/X+BD/AE/n+AggUDC0ACEzhWBPP3eQjKM7UKVKkG9gfHBkcHxIkKMzVLmCIRCiqdN2SU1LLM0pcc4pLQa6Ij7INcAnErdyFafUvOSM3MSi7BCgQxUMDYxMIASaOmV/N7dg15B4X/8wV5d41zBXvxBsxkkmFeVnpxbpJoMlzVElxUOcwoFmK1gAIZqUQrCrj1t8iGtwCG6nKqL6TMHQDITQDGKKjgUA8Iljqw=="
)


def test_a_compressed_body_from_rocketmq_decodes_to_its_topics() -> None:
    assert body_crc32(REAL_COMPRESSED) == 940511102
    topics, version = decode_register_body(REAL_COMPRESSED, compressed=True)
    assert version == {"counter": 0, "timestamp": 1795854651486}
    assert sorted((n, t["readQueueNums"], t["perm"]) for n, t in topics.items()) == [
        ("BenchmarkTest", 1024, 6),
        ("DefaultCluster", 16, 7),
        ("DefaultCluster_REPLY_TOPIC", 1, 6),
        ("OFFSET_MOVED_EVENT", 1, 6),
        ("RMQ_SYS_TRACE_TOPIC", 1, 6),
        ("SCHEDULE_TOPIC_XXXX", 18, 6),
        ("SELF_TEST_TOPIC", 1, 6),
        ("TBW102", 8, 7),
        ("broker-c", 1, 7),
    ]


@pytest.mark.parametrize("compressed", [False, True])
def test_a_body_round_trips(compressed: bool) -> None:
    topics = {
        "T": {
            "topicName": "T",
            "readQueueNums": 4,
            "writeQueueNums": 2,
            "perm": 6,
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": 0,
        }
    }
    version = {"counter": 3, "timestamp": 1700000000000}
    body = encode_register_body(topics, version, compressed)
    got, got_version = decode_register_body(body, compressed)
    assert got_version == version
    assert {k: {f: v[f] for f in topics["T"]} for k, v in got.items()} == topics


@pytest.mark.parametrize("compressed", [False, True])
def test_a_body_that_does_not_decode_is_an_error_naming_it(compressed: bool) -> None:
    with pytest.raises(RegisterBodyError, match="Failed to decode RegisterBrokerBody"):
        decode_register_body(b"\x00garbage", compressed)


def _register(
    table: RouteTable, counter: int, perm: int = 6, now: float = 0.0, **kw: object
) -> None:
    args: dict[str, object] = {
        "cluster": "C",
        "addr": "1.1.1.1:10911",
        "name": "b1",
        "broker_id": 0,
        "ha_addr": "1.1.1.1:10912",
        "topics": {"T": {"readQueueNums": 4, "writeQueueNums": 4, "perm": perm}},
        "data_version": {"counter": counter, "timestamp": 5},
        "peer": "conn1",
        "now": now,
    }
    args.update(kw)
    table.register(**args)  # type: ignore[arg-type]


def test_a_wiped_write_permission_holds_until_the_brokers_topics_change() -> None:
    table = RouteTable()
    _register(table, 1)
    assert table.set_write_perm("b1", writable=False) == 1
    _register(table, 1)  # the periodic registration, same version: the route keeps it
    assert table.queue_datas("T")[0]["perm"] == 4
    _register(table, 2)  # the broker's topics changed: its own permission again
    assert table.queue_datas("T")[0]["perm"] == 6


def test_a_broker_goes_with_its_connection_or_its_silence() -> None:
    table = RouteTable()
    _register(table, 1)
    _register(table, 1, addr="2.2.2.2:10911", name="b2", peer="conn2")
    table.connection_closed("conn1")
    assert [q["brokerName"] for q in table.queue_datas("T")] == ["b2"]
    assert table.clusters == {"C": {"b2"}}
    assert table.expire(EXPIRY_S - 1) == []
    table.touch("2.2.2.2:10911", 10.0)  # QUERY_DATA_VERSION with an unchanged table
    assert table.expire(EXPIRY_S + 5) == []
    assert table.expire(EXPIRY_S + 11) == ["2.2.2.2:10911"]
    assert table.topics == {} and table.brokers == {} and table.clusters == {}


def test_a_topic_deleted_for_one_cluster_stays_on_the_others() -> None:
    table = RouteTable()
    _register(table, 1)
    _register(table, 1, cluster="D", addr="2.2.2.2:10911", name="b2", peer="conn2")
    table.delete_topic("T", "C")
    assert [q["brokerName"] for q in table.queue_datas("T")] == ["b2"]
    table.delete_topic("T", None)
    assert table.queue_datas("T") == []


def test_a_slave_learns_its_master() -> None:
    table = RouteTable()
    _register(table, 1)
    master = table.register(
        cluster="C",
        addr="1.1.1.2:10911",
        name="b1",
        broker_id=1,
        ha_addr="1.1.1.2:10912",
        topics={},
        data_version={"counter": 1, "timestamp": 5},
        peer="conn3",
        now=0.0,
    )
    assert master == ("1.1.1.1:10911", "1.1.1.1:10912")
    assert table.broker_data("b1") == {
        "brokerAddrs": {"0": "1.1.1.1:10911", "1": "1.1.1.2:10911"},
        "brokerName": "b1",
        "cluster": "C",
    }
