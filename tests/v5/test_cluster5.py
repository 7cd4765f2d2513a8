"""RocketMQ 5 clients on a cluster of several brokers, through one broker's gRPC endpoint.

RocketMQ 5's proxy in local mode (one per broker) answers QueryRoute and QueryAssignment
with every broker's queues, each at that broker's host and gRPC port, so a client that
was given one access point sends, receives and acks at each queue's own broker
(LocalTopicRouteService.getTopicRouteForProxy, RouteActivity; docs/broker.md, "Several
brokers"). Before, idemp's endpoint listed its own broker only: a 5.x consumer never saw
what was sent to the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idemp.broker.process import BrokerProcess, NamesrvProcess
from idemp.broker.v5.schema import pb
from idemp.remoting import RemotingCommand, RequestCode
from idemp.remoting.acl import signature
from tests.broker.rawclient import RawClient

from .conftest import Client5
from .raw import Raw, query_route, resource

pytestmark = pytest.mark.idemp_only("starts idemp's brokers with --no-namesrv")

QUEUES = 2
# The official SimpleConsumer (5.1.2) picks a queue at random for each receive: its
# __select_topic_queue builds a new QueueSelector, random start, every time instead of
# using the one it keeps. So receives can land on one broker for a while, each empty one
# long-polling 5 s. Up to RECEIVES of them, one broker is missed with odds 2 * 2**-RECEIVES;
# messages stay invisible for longer than those receives can take, so none is delivered
# twice on its own and "each once" is exact.
RECEIVES = 40
INVISIBLE_S = 600


class Cluster:
    def __init__(
        self, a: BrokerProcess, b: BrokerProcess, namesrv: str, ns: NamesrvProcess | None
    ) -> None:
        self.a, self.b, self.namesrv, self.ns = a, b, namesrv, ns

    def create(self, topic: str, group: str, attributes: str = "", **group_fields: Any) -> None:
        for broker in (self.a, self.b):
            with RawClient(broker.broker_addr) as admin:
                assert admin.create_topic(topic, QUEUES, attributes=attributes).code == 0
                assert admin.create_group(group, **group_fields).code == 0

    def stored(self, broker: BrokerProcess, topic: str) -> set[str]:
        """The message ids (UNIQ_KEY, as a 5.x client's sends have) of ``topic`` on
        ``broker``, read by a 4.x client's pulls."""
        with RawClient(broker.broker_addr) as remoting:
            return {
                m.properties["UNIQ_KEY"]
                for q in range(QUEUES)
                for m in remoting.pull_messages(topic, q)
                if "UNIQ_KEY" in m.properties
            }


def start_cluster(mode: str, make_broker: Callable[..., BrokerProcess], tmp_path: Path) -> Cluster:
    """broker-a and broker-b, both with gRPC: under ``idemp namesrv``, or broker-b
    registered with broker-a's embedded nameserver (the endpoint reads the route from
    the nameserver in the first case, from its own in the second)."""
    ns_proc = None
    if mode == "embedded":
        a = make_broker(minInvisibleTimeMillsForRecv=2000)
        namesrv = a.namesrv_addr
    else:
        ns_proc = NamesrvProcess(tmp_path / "namesrv").start()
        namesrv = ns_proc.namesrv_addr
        a = make_broker(
            namesrvAddr=namesrv, embeddedNamesrv="false", minInvisibleTimeMillsForRecv=2000
        )
    b = make_broker(
        namesrvAddr=namesrv,
        embeddedNamesrv="false",
        brokerName="broker-b",
        minInvisibleTimeMillsForRecv=2000,
    )
    return Cluster(a, b, namesrv, ns_proc)


@pytest.fixture(params=["idemp namesrv", "embedded"])
def cluster(
    request: pytest.FixtureRequest, make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> Iterator[Cluster]:
    made = start_cluster(request.param, make_broker, tmp_path)
    yield made
    if made.ns is not None:
        made.ns.stop()


def _receive_from_both(client: Client5, want: int) -> list[dict[str, Any]]:
    """SimpleConsumer "c"'s receives until ``want`` messages came (see RECEIVES)."""
    got: list[dict[str, Any]] = []
    for _ in range(RECEIVES):
        if len(got) >= want:
            break
        got += client.ok("receive", name="c", max=16, invisible=INVISIBLE_S)["messages"]
    return got


def _endpoint(queue: Any) -> tuple[str, str]:
    (address,) = queue.broker.endpoints.addresses
    return queue.broker.name, f"{address.host}:{address.port}"


def test_route_and_assignments_name_every_broker_at_its_own_endpoint(cluster: Cluster) -> None:
    cluster.create("CT", "CG")
    a_at, b_at = cluster.a.grpc_addr, cluster.b.grpc_addr
    raw = Raw(a_at)
    try:
        endpoints = pb.Endpoints(
            scheme=pb.IPv4, addresses=[pb.Address(host="127.0.0.1", port=int(a_at.split(":")[1]))]
        )
        route = raw.unary(
            "QueryRoute",
            pb.QueryRouteRequest(topic=resource("CT"), endpoints=endpoints),
            pb.QueryRouteResponse,
        )
        assignment = raw.unary(
            "QueryAssignment",
            pb.QueryAssignmentRequest(
                topic=resource("CT"), group=resource("CG"), endpoints=endpoints
            ),
            pb.QueryAssignmentResponse,
        )
    finally:
        raw.close()
    assert route.status.code == pb.OK
    # the brokers in the order of RocketMQ's route (a Java HashMap by name: broker-b first)
    assert [(*_endpoint(q), q.id, q.permission) for q in route.message_queues] == [
        ("broker-b", b_at, 0, pb.READ_WRITE),
        ("broker-b", b_at, 1, pb.READ_WRITE),
        ("broker-a", a_at, 0, pb.READ_WRITE),
        ("broker-a", a_at, 1, pb.READ_WRITE),
    ]
    assert {q.broker.id for q in route.message_queues} == {0}
    assert all(list(q.accept_message_types) == [pb.NORMAL] for q in route.message_queues)
    assert assignment.status.code == pb.OK
    assert [(*_endpoint(a.message_queue), a.message_queue.id) for a in assignment.assignments] == [
        ("broker-b", b_at, -1),
        ("broker-a", a_at, -1),
    ]


def test_a_topic_only_another_broker_has_is_routed_there_of_unspecified_type(
    cluster: Cluster,
) -> None:
    """As RocketMQ 5.3.3's proxy in local mode answered for a topic its own broker did
    not have (measured with two brokers): the other broker's queues, the message types
    read from its own broker's config: UNSPECIFIED."""
    with RawClient(cluster.b.broker_addr) as admin:
        assert admin.create_topic("OnlyB", QUEUES, attributes="+message.type=FIFO").code == 0
    route, missing = (
        query_route(cluster.a.grpc_addr, "OnlyB"),
        query_route(cluster.a.grpc_addr, "Nowhere"),
    )
    assert route.status.code == pb.OK
    assert [(*_endpoint(q), q.id, list(q.accept_message_types)) for q in route.message_queues] == [
        ("broker-b", cluster.b.grpc_addr, i, [pb.MESSAGE_TYPE_UNSPECIFIED]) for i in range(QUEUES)
    ]
    assert missing.status.code == pb.TOPIC_NOT_FOUND


def test_a_client_given_one_broker_sends_to_and_receives_from_all(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A 5.x producer at broker-a's endpoint spreads its sends over both brokers; a
    SimpleConsumer there receives them and what a 4.x client sent to broker-b, each
    once, and acks each at its own broker (an ack at another broker is refused)."""
    cluster.create("CT", "CG")
    with RawClient(cluster.b.broker_addr) as remoting:
        for i in range(6):
            assert remoting.send_message("CT", f"4x-{i}".encode(), queue_id=i % QUEUES).code == 0
    client = Client5(cluster.a.grpc_addr, tmp_path / "client5.log")
    try:
        client.ok("producer", name="p", topics=["CT"])
        sent = client.ok(
            "send", name="p", messages=[{"topic": "CT", "body": f"5x-{i}"} for i in range(20)]
        )["receipts"]
        on_a, on_b = cluster.stored(cluster.a, "CT"), cluster.stored(cluster.b, "CT")
        # the producer's round robin over the four queues: half on each broker
        assert len(on_a) == len(on_b) == 10
        assert on_a | on_b == {r["message_id"] for r in sent}
        client.ok("simple", name="c", group="CG", subs={"CT": "*"}, **{"await": 5})
        got = _receive_from_both(client, 26)
        assert sorted(m["body"] for m in got) == sorted(
            [f"5x-{i}" for i in range(20)] + [f"4x-{i}" for i in range(6)]
        )
        for m in got:
            client.ok("ack", name="c", ref=m["ref"])
    finally:
        client.close()


def test_a_push_consumer_given_one_broker_consumes_every_brokers_messages(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.create("CT", "CG")
    for i, broker in enumerate((cluster.a, cluster.b, cluster.a, cluster.b)):
        with RawClient(broker.broker_addr) as remoting:
            for q in range(QUEUES):
                assert remoting.send_message("CT", f"m{i}-{q}".encode(), queue_id=q).code == 0
    client = Client5(cluster.a.grpc_addr, tmp_path / "client5.log")
    try:
        client.ok("push", name="push", group="CG", subs={"CT": "*"})
        calls = client.ok("wait_push", name="push", count=8, within=40)["calls"]
        assert sorted(c["body"] for c in calls) == sorted(
            f"m{i}-{q}" for i in range(4) for q in range(QUEUES)
        )
        assert all(c["result"] == "SUCCESS" and c["delivery_attempt"] == 1 for c in calls)
    finally:
        client.close()


def test_fifo_message_groups_keep_their_order_across_the_cluster(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A FIFO topic and an orderly group on both brokers: the producer at broker-a's
    endpoint hashes each message group onto one queue of the whole route, so a group
    stays on one broker; the push consumer there gets every group in its send order."""
    cluster.create("FT", "FG", "+message.type=FIFO", consumeMessageOrderly=True)
    groups = [f"g{n}" for n in range(6)]
    client = Client5(cluster.a.grpc_addr, tmp_path / "client5.log")
    try:
        client.ok("producer", name="p", topics=["FT"])
        client.ok("push", name="c", group="FG", subs={"FT": "*"})
        client.ok(
            "send",
            name="p",
            messages=[
                {"topic": "FT", "body": f"{g}-{i}", "message_group": g}
                for i in range(5)
                for g in groups
            ],
        )
        calls = client.ok("wait_push", name="c", count=30, within=60, timeout=90)["calls"]
    finally:
        client.close()
    assert len(calls) == 30
    for g in groups:
        assert [c["body"] for c in calls if c["message_group"] == g] == [
            f"{g}-{i}" for i in range(5)
        ]
    on_b = {m.body.decode().split("-")[0] for q in range(QUEUES) for m in _pulled(cluster.b, q)}
    on_a = {m.body.decode().split("-")[0] for q in range(QUEUES) for m in _pulled(cluster.a, q)}
    assert on_a | on_b == set(groups) and not on_a & on_b  # each group on one broker
    assert on_a and on_b  # and the groups spread over both


def _pulled(broker: BrokerProcess, queue: int) -> list[Any]:
    with RawClient(broker.broker_addr) as remoting:
        return remoting.pull_messages("FT", queue)


def test_transactions_end_at_the_broker_holding_the_half_message(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Transactional sends go round the whole route; each commit or rollback goes to the
    endpoint of the queue its half message went to, whose broker has the transaction."""
    cluster.create("TT", "TG", "+message.type=TRANSACTION")
    client = Client5(cluster.a.grpc_addr, tmp_path / "client5.log")
    try:
        client.ok("producer", name="p", topics=["TT"], check="ROLLBACK")
        for i in range(8):  # four queues: two on each broker, each used twice
            end = "commit" if i % 2 == 0 else "rollback"
            client.ok("send_tx", name="p", message={"topic": "TT", "body": f"{end}-{i}"}, end=end)
        client.ok("simple", name="c", group="TG", subs={"TT": "*"}, **{"await": 5})
        got = _receive_from_both(client, 4)
        for m in got:
            client.ok("ack", name="c", ref=m["ref"])
        assert client.ok("receive", name="c", max=32, invisible=30)["messages"] == []
        assert client.ok("checks")["checks"] == []  # none was left for the checker
    finally:
        client.close()
    assert sorted(m["body"] for m in got) == [f"commit-{i}" for i in (0, 2, 4, 6)]
    stored_on = [cluster.stored(b, "TT") for b in (cluster.a, cluster.b)]
    assert len(stored_on[0]) == len(stored_on[1]) == 2  # the committed, on both brokers


def test_brokers_that_cannot_serve_5x_clients_are_left_out(
    cluster: Cluster, make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """broker-c has gRPC off (as a RocketMQ 4.x broker has none); broker-d has ACL on and
    refuses the unsigned question for its port. Neither is offered: a 5.x client could
    not reach the one, and the other's port is unknown. Every broker has the topic."""
    acl = tmp_path / "acl" / "plain_acl.yml"
    acl.parent.mkdir()
    acl.write_text(
        "accounts:\n  - accessKey: operator\n    secretKey: s3cr3t-ops\n    admin: true\n"
    )
    joining = {"namesrvAddr": cluster.namesrv, "embeddedNamesrv": "false"}
    c = make_broker(brokerName="broker-c", grpcServerPort=-1, **joining)
    d = make_broker(brokerName="broker-d", aclEnable="true", aclPlainFile=str(acl), **joining)
    cluster.create("Everywhere", "EverywhereGroup")
    with RawClient(c.broker_addr) as admin:
        assert admin.create_topic("Everywhere", QUEUES).code == 0
    with RawClient(d.broker_addr) as admin:
        create = {
            "topic": "Everywhere",
            "defaultTopic": "TBW102",
            "readQueueNums": str(QUEUES),
            "writeQueueNums": str(QUEUES),
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
            "AccessKey": "operator",
            "OnsChannel": "ALIYUN",
        }
        cmd = RemotingCommand(code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=create)
        cmd.ext_fields["Signature"] = signature(cmd, "s3cr3t-ops")
        assert admin.wait_response(admin.send(cmd)).code == 0
    route = query_route(cluster.a.grpc_addr, "Everywhere")
    assert route.status.code == pb.OK
    assert sorted({q.broker.name for q in route.message_queues}) == ["broker-a", "broker-b"]


def test_without_a_nameserver_the_endpoint_routes_to_its_own_broker(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """broker-a asks the nameserver for the route (``--no-namesrv``); with none answering,
    its own queues are what it can vouch for."""
    cluster = start_cluster("idemp namesrv", make_broker, tmp_path)
    assert cluster.ns is not None
    cluster.create("CT", "CG")
    cluster.ns.stop()
    route = query_route(cluster.a.grpc_addr, "CT")
    assert route.status.code == pb.OK
    assert [(q.broker.name, q.id) for q in route.message_queues] == [
        ("broker-a", i) for i in range(QUEUES)
    ]
