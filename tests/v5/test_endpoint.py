"""The gRPC endpoint's configuration: its port, turning it off, a port already taken."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from idemp.broker.process import BrokerProcess, BrokerStartError


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
