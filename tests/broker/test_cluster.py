"""Clusters of several brokers: ``idemp broker --no-namesrv`` registers with a nameserver
(another broker's embedded one, or ``idemp namesrv``) as RocketMQ's broker does, and the
nameserver merges the routes. Compared with RocketMQ 4.9.7: its brokers registered with
idemp's nameserver and idemp's broker with its nameserver, mqadmin's clusterList and
topicRoute alike (docs/broker.md, "Several brokers").
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess, NamesrvProcess
from idemp.client import ClientSettings, ConsumeFrom, ConsumerSettings, OutMessage, Producer
from idemp.message import Message
from idemp.reconcile.loaders import load_cluster_offsets
from idemp.remoting import RequestCode, ResponseCode, jsonlenient
from idemp.runners import ConcurrentRunner, OrderlyRunner
from tests.broker.official_scripts import Clients
from tests.broker.rawclient import RawClient
from tests.client.conftest import wait_for
from tests.realbroker import real_home

TOPIC, QUEUES = "ClusterT", 4


def _route(namesrv: str, topic: str) -> dict[str, object] | None:
    with RawClient(namesrv) as c:
        answer = c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if answer.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    route: dict[str, object] = jsonlenient.loads(answer.body)
    return route


def _brokers_of(namesrv: str, topic: str) -> list[str]:
    route = _route(namesrv, topic)
    if route is None:
        return []
    return sorted(qd["brokerName"] for qd in route["queueDatas"])  # type: ignore[attr-defined]


def _cluster(namesrv: str) -> dict[str, object]:
    with RawClient(namesrv) as c:
        answer = c.request(RequestCode.GET_BROKER_CLUSTER_INFO, {})
    assert answer.code == ResponseCode.SUCCESS
    info: dict[str, object] = jsonlenient.loads(answer.body)
    return info


def _create_topic(broker: BrokerProcess) -> None:
    with RawClient(broker.broker_addr) as c:
        assert c.create_topic(TOPIC, QUEUES).code == ResponseCode.SUCCESS


@pytest.fixture
def namesrv(tmp_path: Path) -> Iterator[NamesrvProcess]:
    proc = NamesrvProcess(tmp_path / "namesrv").start()
    yield proc
    proc.stop()


def consume_all(
    runner_cls: type[ConcurrentRunner] | type[OrderlyRunner], namesrv: str, group: str, count: int
) -> list[Message]:
    """``count`` messages of TOPIC, from the first offset, in the order consumed (per
    queue, the queue's order for an orderly runner)."""
    got: list[Message] = []
    lock = threading.Lock()

    def listener(message: Message) -> None:
        with lock:
            got.append(message)

    runner = runner_cls(
        listener,
        settings=ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET),
        client=ClientSettings(namesrv_addr=namesrv),
    )
    runner.subscribe(TOPIC)
    runner.start()
    try:
        wait_for(lambda: len(got) >= count, 30, f"{count} messages consumed")
    finally:
        runner.shutdown()
    return got


def _joining(make_broker: Callable[..., BrokerProcess], namesrv: str, name: str) -> BrokerProcess:
    return make_broker(namesrvAddr=namesrv, embeddedNamesrv="false", brokerName=name)


def test_a_broker_joins_another_ones_nameserver(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    a = make_broker()
    b = _joining(make_broker, a.namesrv_addr, "broker-b")
    if real_home() is None:  # idemp's ready line; RocketMQ's brokers register all the same
        assert b.ready_line.split()[3] == f"namesrv={a.namesrv_addr}"
    for broker in (a, b):
        _create_topic(broker)
    route = _route(a.namesrv_addr, TOPIC)
    assert route is not None
    # in the order of RocketMQ's hash maps (its nameserver lists broker-b first too)
    assert route["brokerDatas"] == [
        {"brokerAddrs": {"0": addr}, "brokerName": name, "cluster": "DefaultCluster"}
        for name, addr in (("broker-b", b.broker_addr), ("broker-a", a.broker_addr))
    ]
    queue_datas: list[dict[str, object]] = route["queueDatas"]  # type: ignore[assignment]
    assert [(q["brokerName"], q["writeQueueNums"]) for q in queue_datas] == [
        ("broker-b", QUEUES),
        ("broker-a", QUEUES),
    ]
    info = _cluster(a.namesrv_addr)
    # the nameserver's hash tables in their order, as RocketMQ's writes them
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-b", "broker-a"]}
    assert list(info["brokerAddrTable"]) == ["broker-b", "broker-a"]  # type: ignore[call-overload]

    # a client sends to all eight queues and a consumer reads each message once
    producer = Producer(a.namesrv_addr, "cluster-p").start()
    try:
        queues = producer.publish_queues(TOPIC)
        assert sorted({(q.broker_name, q.queue_id) for q in queues}) == [
            (n, i) for n in ("broker-a", "broker-b") for i in range(QUEUES)
        ]
        sent = [producer.send(OutMessage(TOPIC, f"m{i}".encode())) for i in range(40)]
    finally:
        producer.shutdown()
    assert Counter(r.queue.broker_name for r in sent) == {"broker-a": 20, "broker-b": 20}
    got = [
        (str(m.broker_name), m.body.decode())
        for m in consume_all(ConcurrentRunner, a.namesrv_addr, "cluster-g", 40)
    ]
    assert sorted(body for _, body in got) == sorted(f"m{i}" for i in range(40))
    assert Counter(name for name, _ in got) == {"broker-a": 20, "broker-b": 20}
    # the reconciliation's live offsets of a cluster: each broker's, named
    url = f"namesrv://{a.namesrv_addr}?group=cluster-g&topic={TOPIC}"
    RETRY = ("%RETRY%cluster-g", "cluster-g", 0)  # noqa: N806 - each broker's retry queue
    assert [(o.broker, o.table) for o in load_cluster_offsets(url)] == [
        (name, {**{(TOPIC, "cluster-g", q): 5 for q in range(QUEUES)}, RETRY: 0})
        for name in ("broker-a", "broker-b")
    ]

    # a clean stop unregisters: the route is broker-a's alone at once
    assert b.stop() == 0
    assert _brokers_of(a.namesrv_addr, TOPIC) == ["broker-a"]
    assert _cluster(a.namesrv_addr)["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}


def test_a_killed_broker_leaves_the_routes_and_sends_go_to_the_others(
    make_broker: Callable[..., BrokerProcess], namesrv: NamesrvProcess
) -> None:
    a = _joining(make_broker, namesrv.namesrv_addr, "broker-a")
    b = _joining(make_broker, namesrv.namesrv_addr, "broker-b")
    for broker in (a, b):
        _create_topic(broker)
    assert _brokers_of(namesrv.namesrv_addr, TOPIC) == ["broker-a", "broker-b"]
    producer = Producer(namesrv.namesrv_addr, "failover-p").start()
    try:
        assert len(producer.publish_queues(TOPIC)) == 2 * QUEUES
        b.kill()
        # the nameserver drops a broker whose connection closed (onChannelDestroy)
        wait_for(lambda: _brokers_of(namesrv.namesrv_addr, TOPIC) == ["broker-a"], 10, "b gone")
        sent = [producer.send(OutMessage(TOPIC, f"f{i}".encode())) for i in range(20)]
    finally:
        producer.shutdown()
    assert {r.queue.broker_name for r in sent} == {"broker-a"}

    # started again on its store, it registers and its queues come back
    b.start()
    assert _brokers_of(namesrv.namesrv_addr, TOPIC) == ["broker-a", "broker-b"]


def test_the_official_cpp_client_sends_over_and_consumes_from_both_brokers(
    make_broker: Callable[..., BrokerProcess], namesrv: NamesrvProcess, tmp_path: Path
) -> None:
    """rocketmq-client-python (the C++ client 2.0) given only the nameserver: its sends
    reach the queues of both brokers and its push consumer, concurrent and orderly,
    receives every message once."""
    brokers = [_joining(make_broker, namesrv.namesrv_addr, n) for n in ("broker-a", "broker-b")]
    for broker in brokers:
        _create_topic(broker)
    clients = Clients(tmp_path / "client-home")
    try:
        producer = clients.producer(namesrv.namesrv_addr)
        sent = producer.send({"topic": TOPIC, "body": f"c{i}"} for i in range(80))
        ids = {s["msg_id"] for s in sent}
        stored = []
        for broker in brokers:
            with RawClient(broker.broker_addr) as remoting:
                stored.append(
                    {
                        m.properties["UNIQ_KEY"]
                        for q in range(QUEUES)
                        for m in remoting.pull_messages(TOPIC, q)
                    }
                )
        assert stored[0] | stored[1] == ids
        assert stored[0] and stored[1]  # round robin over all 8 queues
        for orderly in (False, True):
            got = _cpp_consume(clients, namesrv.namesrv_addr, f"cpp-{orderly}", orderly, 80)
            assert Counter(m["id"] for m in got) == Counter(ids)
    finally:
        clients.close()


def _cpp_consume(
    clients: Clients, namesrv: str, group: str, orderly: bool, count: int
) -> list[dict[str, Any]]:
    """``count`` messages of TOPIC through the C++ client's push consumer, then stopped."""
    consumer = clients.consumer(namesrv, group, TOPIC, orderly=orderly)
    consumer.wait(lambda: len(consumer.messages) >= count, 60, f"{count} messages")
    clients.stop_all([consumer])
    assert consumer.errors() == []
    return consumer.messages


def test_the_nameserver_alone_answers_no_route_and_an_empty_cluster(
    namesrv: NamesrvProcess,
) -> None:
    assert _route(namesrv.namesrv_addr, TOPIC) is None
    assert _cluster(namesrv.namesrv_addr) == {"brokerAddrTable": {}, "clusterAddrTable": {}}


@pytest.mark.idemp_only(
    "the refusal is idemp's embedded nameserver's: RocketMQ's has no broker of its own"
)
def test_a_second_broker_under_the_same_name_is_refused_at_start(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    a = make_broker()
    out = subprocess.run(
        [sys.executable, "-m", "idemp", "broker", "--no-namesrv", "-n", a.namesrv_addr]
        + ["--listen-port", "0", "--grpc-port", "-1", "--store", str(tmp_path / "dup")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert (
        f"nameserver {a.namesrv_addr} refused the registration: brokerName broker-a is this "
        f"nameserver's own broker ({a.broker_addr})" in out.stderr
    )
    assert _cluster(a.namesrv_addr)["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}


def test_a_nameserver_that_is_down_at_start_hears_of_the_broker_once_it_is_up(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """As RocketMQ's broker: it starts anyway and registers at its next round."""
    namesrv = NamesrvProcess(tmp_path / "ns")
    namesrv.namesrv_port = _free_port()
    b = make_broker(
        namesrvAddr=namesrv.namesrv_addr,
        embeddedNamesrv="false",
        brokerName="broker-b",
        registerNameServerPeriod=10_000,
    )
    _create_topic(b)
    with namesrv:
        wait_for(
            lambda: _brokers_of(namesrv.namesrv_addr, TOPIC) == ["broker-b"],
            25,
            "the broker's next registration round (10 s)",
        )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_nameserver_keeps_the_kv_config_a_registration_answers_with(
    make_broker: Callable[..., BrokerProcess], namesrv: NamesrvProcess
) -> None:
    """RocketMQ's order config: a topic the nameserver's ORDER_TOPIC_CONFIG names is
    made ``order`` on the broker by the registration's answer."""
    with RawClient(namesrv.namesrv_addr) as c:
        put = c.request(
            RequestCode.PUT_KV_CONFIG,
            {"namespace": "ORDER_TOPIC_CONFIG", "key": TOPIC, "value": "broker-b:4"},
        )
        assert put.code == ResponseCode.SUCCESS
    b = _joining(make_broker, namesrv.namesrv_addr, "broker-b")
    _create_topic(b)  # the topic change registers at once; the answer sets the flag

    def order_flag() -> bool:
        with RawClient(b.broker_addr) as c:
            answer = c.request(RequestCode.GET_ALL_TOPIC_CONFIG, {})
        table = json.loads(answer.body)["topicConfigTable"]
        return bool(table[TOPIC]["order"])

    wait_for(order_flag, 10, "the order flag set from the registration's answer")


def _admin(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "idemp", "admin", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_idemp_admin_creates_on_every_broker_of_a_cluster(
    make_broker: Callable[..., BrokerProcess], namesrv: NamesrvProcess
) -> None:
    a = _joining(make_broker, namesrv.namesrv_addr, "broker-a")
    b = _joining(make_broker, namesrv.namesrv_addr, "broker-b")
    where = ["--namesrv", namesrv.namesrv_addr, "--cluster", "DefaultCluster"]
    done = _admin("update-topic", *where, "--topic", TOPIC, "--queues", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"topic {TOPIC}: 2 queues, type NORMAL on {a.broker_addr}",
        f"topic {TOPIC}: 2 queues, type NORMAL on {b.broker_addr}",
    ]
    assert _brokers_of(namesrv.namesrv_addr, TOPIC) == ["broker-a", "broker-b"]
    done = _admin("update-sub-group", *where, "--group", "billing")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 2

    unknown = _admin("update-topic", "--namesrv", namesrv.namesrv_addr, "--cluster", "Nope")
    assert "the following arguments are required: --topic" in unknown.stderr
    unknown = _admin(
        "update-topic", "--namesrv", namesrv.namesrv_addr, "--cluster", "Nope", "--topic", "X"
    )
    assert (unknown.returncode, unknown.stderr) == (
        1,
        f"idemp admin: cluster Nope has no broker at nameserver {namesrv.namesrv_addr}\n",
    )
    both = _admin("update-topic", "--broker", a.broker_addr, *where, "--topic", "X")
    assert (both.returncode, both.stderr) == (
        2,
        "idemp admin: give --broker, or --namesrv with --cluster\n",
    )


def test_an_orderly_runner_locks_and_keeps_the_order_of_each_brokers_queues(
    make_broker: Callable[..., BrokerProcess], namesrv: NamesrvProcess
) -> None:
    """LOCK_BATCH_MQ goes to each broker for its own queues; per queue, order holds."""
    for name in ("broker-a", "broker-b"):
        _create_topic(_joining(make_broker, namesrv.namesrv_addr, name))
    producer = Producer(namesrv.namesrv_addr, "orderly-cluster-p").start()
    try:
        sent = [
            producer.send_orderly(OutMessage(TOPIC, f"{key}:{i}".encode()), key)
            for i in range(5)
            for key in (f"k{j}" for j in range(8))
        ]
    finally:
        producer.shutdown()
    got: dict[tuple[str, int], list[int]] = {}
    for m in consume_all(OrderlyRunner, namesrv.namesrv_addr, "orderly-cluster-g", len(sent)):
        got.setdefault((str(m.broker_name), m.queue_id), []).append(m.queue_offset)
    expected: dict[tuple[str, int], list[int]] = {}
    for r in sent:
        expected.setdefault((r.queue.broker_name, r.queue.queue_id), []).append(r.queue_offset)
    assert {q for q, _ in expected} == {"broker-a", "broker-b"}
    assert got == expected  # every queue, each message once, in its queue's order


@pytest.mark.parametrize("force", ["true", "false"], ids=["forceRegister", "askFirst"])
def test_a_restarted_nameserver_hears_of_the_broker_at_its_next_round(
    force: str, make_broker: Callable[..., BrokerProcess], namesrv: NamesrvProcess
) -> None:
    """The broker's kept connection died with the old nameserver: the next round
    reconnects and registers (no round lost to the dead connection). With
    forceRegister=false the round asks QUERY_DATA_VERSION first: the new nameserver has
    no version of this broker, so it registers."""
    b = make_broker(
        namesrvAddr=namesrv.namesrv_addr,
        embeddedNamesrv="false",
        brokerName="broker-b",
        registerNameServerPeriod=10_000,
        forceRegister=force,
    )
    _create_topic(b)
    assert namesrv.stop() == 0
    namesrv.start()  # same port, an empty route table
    assert _brokers_of(namesrv.namesrv_addr, TOPIC) == []
    wait_for(
        lambda: _brokers_of(namesrv.namesrv_addr, TOPIC) == ["broker-b"],
        25,
        "the broker's next registration round (10 s)",
    )
    if real_home() is None:  # idemp's log: no registration failed on the dead connection
        assert "register with nameserver" not in b.log_path.read_text()
