"""An idemp broker joining another broker's nameserver: idemp's (``make test``) or, with
IDEMP_4X_REAL, RocketMQ 4.9.7's, beside its broker. The nameserver lists both, and
idemp's client sends across both and consumes every message once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from idemp.broker.process import BrokerProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import Message
from idemp.remoting import RequestCode, ResponseCode, jsonlenient
from idemp.runners import ConcurrentRunner
from tests.broker.rawclient import RawClient
from tests.client.conftest import wait_for

TOPIC, QUEUES, COUNT = "MixedClusterT", 2, 40


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
            "grpcServerPort": "-1",
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
        got: list[str] = []
        lock = threading.Lock()

        def listener(message: Message) -> None:
            with lock:
                got.append(message.body.decode())

        runner = ConcurrentRunner(
            listener,
            settings=ConsumerSettings(
                group="mixed-cluster-g", consume_from=ConsumeFrom.FIRST_OFFSET
            ),
            client=ClientSettings(namesrv_addr=first.namesrv_addr),
        )
        runner.subscribe(TOPIC)
        runner.start()
        try:
            wait_for(lambda: len(got) >= COUNT, 30, f"{COUNT} messages consumed")
        finally:
            runner.shutdown()
        assert sorted(got) == sorted(f"m{i}" for i in range(COUNT))

        # stopped, it unregisters: the route is the first broker's alone
        assert joined.stop() == 0
        with RawClient(first.namesrv_addr) as c:
            answer = c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
        names = [b["brokerName"] for b in jsonlenient.loads(answer.body)["brokerDatas"]]
        assert names == ["broker-a"]
    finally:
        joined.stop()
