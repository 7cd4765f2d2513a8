"""An idemp broker joining another broker's nameserver: idemp's (``make test``) or, with
IDEMP_4X_REAL, RocketMQ 4.9.7's, beside its broker. The nameserver lists both, and
idemp's client sends across both and consumes every message once; the joined broker's
gRPC endpoint routes RocketMQ 5 clients to the brokers that serve gRPC."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from idemp.broker.process import BrokerProcess
from idemp.client import OutMessage, Producer
from idemp.remoting import RequestCode, ResponseCode, jsonlenient
from idemp.runners import ConcurrentRunner
from tests.broker.rawclient import RawClient
from tests.broker.test_cluster import TOPIC, consume_all
from tests.realbroker import real_home
from tests.v5.raw import query_route

QUEUES, COUNT, GROUP = 2, 40, "mixed-cluster-g"


def test_an_idemp_broker_joins_a_nameserver_beside_its_broker(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    first = make_broker()  # RocketMQ 4.9.7 with IDEMP_4X_REAL
    joined = BrokerProcess(
        tmp_path / "joined",
        properties={
            "embeddedNamesrv": "false",
            "namesrvAddr": first.namesrv_addr,
            "brokerName": "broker-idemp",
            "listenPort": "0",
            "grpcServerPort": "0",
        },
    ).start()
    try:
        for broker in (first, joined):
            with RawClient(broker.broker_addr) as c:
                assert c.create_topic(TOPIC, QUEUES).code == ResponseCode.SUCCESS
        with RawClient(first.namesrv_addr) as c:
            answer = c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        route = jsonlenient.loads(answer.body)
        addrs = {b["brokerName"]: b["brokerAddrs"]["0"] for b in route["brokerDatas"]}
        assert addrs == {"broker-a": first.broker_addr, "broker-idemp": joined.broker_addr}

        # RocketMQ 4.9.7's broker names no gRPC port, so 5.x clients are not sent there;
        # idemp's first broker names its own
        route5 = query_route(joined.grpc_addr, TOPIC)
        served = {"broker-idemp"} if real_home() else {"broker-a", "broker-idemp"}
        assert {q.broker.name for q in route5.message_queues} == served

        producer = Producer(first.namesrv_addr, "mixed-cluster-p").start()
        try:
            sent = [producer.send(OutMessage(TOPIC, f"m{i}".encode())) for i in range(COUNT)]
        finally:
            producer.shutdown()
        half = COUNT // 2
        assert Counter(r.queue.broker_name for r in sent) == {
            "broker-a": half,
            "broker-idemp": half,
        }
        got = [
            m.body.decode() for m in consume_all(ConcurrentRunner, first.namesrv_addr, GROUP, COUNT)
        ]
        assert sorted(got) == sorted(f"m{i}" for i in range(COUNT))

        # stopped, it unregisters: the route is the first broker's alone
        assert joined.stop() == 0
        with RawClient(first.namesrv_addr) as c:
            answer = c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
        names = [b["brokerName"] for b in jsonlenient.loads(answer.body)["brokerDatas"]]
        assert names == ["broker-a"]
    finally:
        joined.stop()
