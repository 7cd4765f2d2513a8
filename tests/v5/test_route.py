"""The route a RocketMQ 5 client is given (QueryRoute), as RocketMQ 5.3.3's proxy gives it:
read from the nameserver's route, so what an operator changes there shows. Run against
it with IDEMP_V5_REAL=<proxy>,<broker>,<nameserver>."""

from __future__ import annotations

import time
from collections.abc import Callable

from idemp.broker.v5.schema import pb
from idemp.remoting import RequestCode
from tests.broker.rawclient import RawClient

from .conftest import Endpoint5
from .raw import query_route

# RocketMQ 5.3.3's proxy caches a topic's route: a change at the nameserver shows in its
# answers ~20 s later (measured 20.4 s); idemp's endpoint reads the route when asked
ROUTE_CACHE_S = 40


def _permissions(broker5: Endpoint5, topic: str, want: int) -> set[int]:
    """The permissions of the topic's queues, once they are all ``want`` or the proxy's
    route cache had time to renew."""
    deadline = time.monotonic() + ROUTE_CACHE_S
    while True:
        route = query_route(broker5.grpc_addr, topic)
        assert route.status.code == pb.OK, route.status
        seen = {mq.permission for mq in route.message_queues}
        if seen == {want} or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)  # polled, bounded by the deadline


def test_wipe_write_perm_leaves_the_brokers_queues_read_only_until_added_back(
    broker5: Endpoint5, admin: RawClient, names: Callable[[str], str]
) -> None:
    """mqadmin wipeWritePerm -b broker-a (how an operator drains a broker before
    stopping it): a 5.x producer's route then has no writable queue on it. idemp's
    endpoint had kept answering READ_WRITE."""
    topic = names("TWipe")
    assert admin.create_topic(topic, 2).code == 0
    assert _permissions(broker5, topic, pb.READ_WRITE) == {pb.READ_WRITE}
    with RawClient(broker5.namesrv_addr) as ns:
        wiped = ns.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        try:
            assert wiped.code == 0
            assert _permissions(broker5, topic, pb.READ) == {pb.READ}
        finally:
            added = ns.request(RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert added.code == 0
    assert _permissions(broker5, topic, pb.READ_WRITE) == {pb.READ_WRITE}
