"""The rest of the cluster, as one broker's gRPC endpoint shows it to RocketMQ 5 clients.

RocketMQ 5's proxy in local mode answers QueryRoute and QueryAssignment with the
nameserver's route of the topic (LocalTopicRouteService.getTopicRouteForProxy): every
broker's queues, each at that broker's host and a gRPC port. A client that knows one
access point so sends, receives and acks at each queue's own broker; without the other
brokers a 5.x consumer never sees what was sent to them. The proxy puts every broker at
the port it listens on itself (one proxy per host); idemp's brokers may share a host, so
a peer's port is asked of the peer (GET_BROKER_CONFIG's ``grpcServerPort``) and kept a
while. A broker that names no gRPC port (RocketMQ 4.x) cannot serve a 5.x client and is
left out, as is one that refuses the question (ACL on it): on a shared host the proxy's
rule (this broker's port) would route its queues back here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemp.remoting import RequestCode, ResponseCode
from idemp.remoting.javahash import hash_map_order
from idemp.remoting.route import parse_route

from ..config import read_properties
from ..link import RemotingLink
from ..metadata import Perm
from ..namesrv import route_perm
from ..registration import registered_perm
from .schema import pb

if TYPE_CHECKING:
    from ..context import Broker

log = logging.getLogger("idemp.broker.v5")

ROUTE_TTL_S = 3.0  # a nameserver's answer, reused for this long (the proxy's cache: 20 s)
PORT_TTL_S = 30.0  # a peer's gRPC port: a restarted peer's new one is learned within this
UNREACHABLE_TTL_S = 5.0  # a peer that did not answer is asked again after this
# within a 5.x client's own request timeout (3 s by default) for the route it asked
REQUEST_TIMEOUT_S = 1.0
MASTER_ID = 0


@dataclass(frozen=True)
class BrokerQueues:
    """One broker's queues of a topic: at ``endpoint`` (host, gRPC port), or at this
    broker (None: under the address the client used)."""

    name: str
    broker_id: int
    perm: int
    read_queues: int
    write_queues: int
    endpoint: tuple[str, int] | None

    @property
    def readable_master(self) -> bool:
        """Assignments name masters only (RouteActivity reads MixAll.MASTER_ID's)."""
        return self.broker_id == MASTER_ID and bool(self.perm & Perm.READ) and self.read_queues > 0

    def broker(self, here: Any) -> Any:
        """The ``Broker`` of a message queue; ``here`` is this broker's, as answered."""
        if self.endpoint is None:
            return here
        host, port = self.endpoint
        return pb.Broker(
            name=self.name,
            id=self.broker_id,
            endpoints=pb.Endpoints(
                scheme=_scheme(host), addresses=[pb.Address(host=host, port=port)]
            ),
        )

    def message_queues(self, topic: Any, here: Any, accepts: list[int]) -> list[Any]:
        """QueryRoute's queues of this broker (RouteActivity.genMessageQueueFromQueueData):
        read-only ones first, then write-only, read-write, and for a broker that allows
        neither as many NONE queues as it has."""
        readable, writable = bool(self.perm & Perm.READ), bool(self.perm & Perm.WRITE)
        nr, nw = self.read_queues, self.write_queues
        rw = min(nr, nw) if readable and writable else 0
        r = nr - rw if readable else 0
        w = nw - rw if writable else 0
        n = 0 if readable or writable else max(1, nr, nw)
        broker = self.broker(here)
        kinds = [pb.READ] * r + [pb.WRITE] * w + [pb.READ_WRITE] * rw + [pb.NONE] * n
        return [
            pb.MessageQueue(
                topic=topic, id=i, permission=kind, broker=broker, accept_message_types=accepts
            )
            for i, kind in enumerate(kinds)
        ]


def _scheme(host: str) -> int:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return int(pb.DOMAIN_NAME)
    return int(pb.IPv4 if ip.version == 4 else pb.IPv6)


Route = tuple[list[dict[str, Any]], dict[str, dict[int, str]]]


class ClusterView:
    def __init__(self, server: Broker) -> None:
        self.server = server
        self._links: dict[str, RemotingLink] = {}
        self._routes: dict[str, tuple[float, Route]] = {}
        self._ports: dict[str, tuple[float, int | None]] = {}
        self._told: set[str] = set()

    async def queues(self, topic: str) -> list[BrokerQueues]:
        """The topic's queues on this broker (when it has the topic) and on every other
        broker of the route that serves gRPC, brokers in the route's order."""
        server = self.server
        own = server.config.brokerName
        out: list[BrokerQueues] = []
        assert server.store is not None
        cfg = server.store.topics.get(topic)
        queue_datas, brokers = await self._route(topic)
        if cfg is not None:
            # the proxy reads the route: a wipeWritePerm leaves this broker's queues read-only
            if server.config.embeddedNamesrv:
                perm = route_perm(server, cfg)
            else:
                routed = [qd for qd in queue_datas if qd.get("brokerName") == own]
                perm = (
                    int(routed[0].get("perm", 0))
                    if routed
                    else registered_perm(server.config.brokerPermission, cfg.perm)
                )
            queues = (cfg.readQueueNums, cfg.writeQueueNums)
            out.append(BrokerQueues(own, server.config.brokerId, perm, *queues, None))
        peers = [
            (qd, name, broker_id, addr)
            for qd in queue_datas
            if (name := str(qd.get("brokerName"))) != own
            for broker_id, addr in sorted(brokers.get(name, {}).items())
        ]
        # asked side by side: one slow peer costs a client's route one timeout, not one each
        ports = await asyncio.gather(*(self._grpc_port(name, addr) for _, name, _, addr in peers))
        for (qd, name, broker_id, addr), port in zip(peers, ports):
            if port is None:
                continue
            out.append(
                BrokerQueues(
                    name,
                    broker_id,
                    int(qd.get("perm", 0)),
                    int(qd.get("readQueueNums", 0)),
                    int(qd.get("writeQueueNums", 0)),
                    (addr.rpartition(":")[0], port),
                )
            )
        order = {n: i for i, n in enumerate(hash_map_order(q.name for q in out))}
        out.sort(key=lambda q: (order[q.name], q.broker_id))
        return out

    async def _route(self, topic: str) -> Route:
        server = self.server
        if server.config.embeddedNamesrv:  # the brokers registered here
            routes = server.namesrv.routes
            queue_datas = routes.queue_datas(topic)  # of registered brokers only
            names = {qd["brokerName"] for qd in queue_datas}
            return queue_datas, {n: dict(routes.brokers[n].addrs) for n in names}
        now = time.monotonic()
        cached = self._routes.get(topic)
        if cached is not None and now - cached[0] < ROUTE_TTL_S:
            return cached[1]
        route = await self._ask_route(topic)
        if len(self._routes) > 1000:
            self._routes.clear()
        self._routes[topic] = (now, route)
        return route

    async def _ask_route(self, topic: str) -> Route:
        """GET_ROUTEINFO_BY_TOPIC of the first nameserver that answers; none answering,
        this broker's own queues only (said once)."""
        fields = {"topic": topic, "acceptStandardJsonOnly": "true"}
        for addr in self.server.config.namesrv_addrs:
            try:
                answer = await self._link(addr, "nameserver").request(
                    RequestCode.GET_ROUTEINFO_BY_TOPIC, fields, b"", REQUEST_TIMEOUT_S
                )
            except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
                self._tell(f"down {addr}", f"gRPC routes: nameserver {addr} did not answer: {exc}")
                continue
            if answer.code != ResponseCode.SUCCESS or not answer.body:
                return [], {}
            try:
                route = parse_route(answer.body)
            except ValueError as exc:  # not a route: as if it had none
                self._tell(f"bad {addr}", f"gRPC routes: nameserver {addr}'s route: {exc}")
                return [], {}
            return route.queue_datas, route.brokers
        return [], {}

    async def _grpc_port(self, name: str, addr: str) -> int | None:
        """The peer's gRPC port, or None (said once per peer and reason) when it has none
        a 5.x client could be sent to."""
        now = time.monotonic()
        cached = self._ports.get(addr)
        if cached is not None and now - cached[0] < (
            PORT_TTL_S if cached[1] is not None else UNREACHABLE_TTL_S
        ):
            return cached[1]
        port, trouble = await self._ask_port(addr)
        if trouble:  # said once per peer and kind of trouble (what precedes the detail)
            text = f"broker {name} at {addr} {trouble}: 5.x clients are not sent its queues"
            self._tell(f"{addr} {trouble.split(' (')[0]}", text)
        self._ports[addr] = (now, port)
        return port

    async def _ask_port(self, addr: str) -> tuple[int | None, str]:
        try:
            answer = await self._link(addr, "broker").request(
                RequestCode.GET_BROKER_CONFIG, {}, b"", REQUEST_TIMEOUT_S
            )
        except (OSError, asyncio.TimeoutError, ConnectionError) as exc:
            return None, f"did not answer ({exc or type(exc).__name__})"
        if answer.code != ResponseCode.SUCCESS:  # ACL on it, say: unsigned, refused
            return None, f"refused getBrokerConfig ({answer.code} {answer.remark})"
        text = (answer.body or b"").decode("utf-8", errors="replace")
        value = read_properties(text).get("grpcServerPort", "").strip()
        if not value.isdigit() or int(value) <= 0:
            return None, "serves no gRPC"
        return int(value), ""

    def _link(self, addr: str, what: str) -> RemotingLink:
        link = self._links.get(addr)
        if link is None:
            link = self._links[addr] = RemotingLink(addr, self.server.opaques, what)
        return link

    def _tell(self, key: str, text: str) -> None:
        """Once per peer and kind of trouble, not at every client's route refresh."""
        if key not in self._told:
            self._told.add(key)
            log.warning("%s", text)

    def close(self) -> None:
        for link in self._links.values():
            link.close()
        self._links.clear()
