"""The gRPC endpoint's configuration: its port, turning it off, a port already taken."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from idemp.broker.process import BrokerProcess, BrokerStartError
from tests.broker.rawclient import RawClient

from .conftest import Client5


def test_grpc_off(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker(grpcServerPort=-1)
    assert " grpc=off " in broker.ready_line
    assert broker.grpc_port == 0


def test_a_taken_grpc_port_stops_the_start_with_a_clear_error(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BrokerStartError) as failed:
            make_broker(grpcServerPort=port)
    assert f"cannot listen on 127.0.0.1:{port} for gRPC (grpcServerPort)" in str(failed.value)


def test_two_brokers_on_free_ports_get_distinct_grpc_ports(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    one, two = make_broker(), make_broker()
    assert one.grpc_port and two.grpc_port and one.grpc_port != two.grpc_port


def test_the_default_minimum_invisible_time_is_rocketmqs(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = make_broker()  # minInvisibleTimeMillsForRecv left at its default
    with RawClient(broker.broker_addr) as admin:
        assert admin.create_topic("Min5", 1).code == 0
    client = Client5(broker.grpc_addr, tmp_path / "client5.log")
    try:
        client.ok("simple", name="c", group="G5", subs={"Min5": "*"}, **{"await": 5})
        answer = client.call("receive", name="c", max=16, invisible=9)
    finally:
        client.close()
    assert (answer["ok"], answer["code"]) == (False, 40011)
    assert "the invisibleTime is too small. min is 10000" in answer["message"]


def test_a_free_grpc_port_is_never_the_one_the_vip_channel_takes_on_a_restart() -> None:
    """A broker on free ports, started again on them (BrokerProcess does so), opens its
    VIP channel on listenPort - 2 before its gRPC port: a first free gRPC port there made
    the restart fail (found in CI). Here the system "hands out" that port first."""
    from idemp.broker.v5.endpoint import listen_avoiding

    async def scenario() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            avoid = probe.getsockname()[1]
        asked = [avoid]  # the first listen gets the avoided port, the next a free one

        async def listen() -> asyncio.Server:
            port = asked.pop() if asked else 0
            return await loop.create_server(asyncio.Protocol, "127.0.0.1", port)

        server = await listen_avoiding(listen, avoid)
        got = server.sockets[0].getsockname()[1]
        # the avoided port was let go: listening there again works
        again = await loop.create_server(asyncio.Protocol, "127.0.0.1", avoid)
        reopened = again.sockets[0].getsockname()[1]
        for s in (server, again):
            s.close()
            await s.wait_closed()
        return avoid, got, reopened

    avoid, got, reopened = asyncio.run(scenario())
    assert got != avoid and reopened == avoid
