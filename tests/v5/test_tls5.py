"""TLS on the gRPC endpoint, as RocketMQ 5.3.3's proxy has it (measured: its gRPC port
answers a TLS client with a self-signed certificate, ALPN h2, beside plain clients): the
broker's ``tls.server.mode`` and certificates, shared with its remoting ports."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import grpc
import pytest

from idemp.broker.process import BrokerProcess
from idemp.broker.v5.schema import SERVICE, pb
from tests.broker.rawclient import RawClient
from tests.broker.test_tls import write_certificate

from .conftest import Client5
from .raw import METADATA


def _route(channel: grpc.Channel) -> Any:
    call: Any = channel.unary_unary(
        f"/{SERVICE}/QueryRoute",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.QueryRouteResponse.FromString,
    )
    return call(pb.QueryRouteRequest(), metadata=METADATA, timeout=10)


def _tls_channel(addr: str, root: bytes) -> grpc.Channel:
    """grpc's client checks the chain and the name: the certificate says CN=localhost."""
    credentials = grpc.ssl_channel_credentials(root_certificates=root)
    options = [("grpc.ssl_target_name_override", "localhost")]
    return grpc.secure_channel(addr, credentials, options=options)


def _handshake(addr: str) -> tuple[str | None, bytes]:
    """The protocol ALPN agreed on, and the server's certificate (PEM)."""
    host, port = addr.rsplit(":", 1)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return tls.selected_alpn_protocol(), ssl.DER_cert_to_PEM_cert(der).encode()


def test_tls_and_plain_clients_on_the_grpc_port_by_default(
    make_broker: Callable[..., BrokerProcess],
) -> None:
    broker = make_broker()
    alpn, certificate = _handshake(broker.grpc_addr)
    assert alpn == "h2"
    with closing(_tls_channel(broker.grpc_addr, certificate)) as channel:
        answer = _route(channel)
    assert answer.status.code == pb.ILLEGAL_TOPIC  # an answer of the service, over TLS
    with closing(grpc.insecure_channel(broker.grpc_addr)) as channel:
        assert _route(channel).status.code == pb.ILLEGAL_TOPIC


def test_enforcing_closes_plain_grpc_clients(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker(**{"tls.server.mode": "enforcing"})
    with closing(grpc.insecure_channel(broker.grpc_addr)) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            _route(channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    _, certificate = _handshake(broker.grpc_addr)
    with closing(_tls_channel(broker.grpc_addr, certificate)) as channel:
        assert _route(channel).status.code == pb.ILLEGAL_TOPIC


def test_disabled_closes_tls_grpc_clients(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker(**{"tls.server.mode": "disabled"})
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(broker.grpc_addr)
    with closing(grpc.insecure_channel(broker.grpc_addr)) as channel:
        assert _route(channel).status.code == pb.ILLEGAL_TOPIC


def test_the_5x_client_over_tls_with_a_certificate_from_files(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """The official client's ``tls_enable`` uses grpc's default roots;
    ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` makes the broker's certificate one of them."""
    cert, key = write_certificate(tmp_path, "localhost")
    broker = make_broker(
        **{
            "tls.server.mode": "enforcing",
            "tls.test.mode.enable": "false",
            "tls.server.certPath": str(cert),
            "tls.server.keyPath": str(key),
        }
    )
    with RawClient(broker.broker_addr, tls=_insecure()) as admin:
        assert admin.create_topic("Tls5", 1).code == 0
    endpoint = f"localhost:{broker.grpc_port}"
    env = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(cert)}
    client = Client5(endpoint, tmp_path / "client5.log", env=env)
    try:
        client.ok("producer", name="p", topics=["Tls5"], tls=True)
        sent = [{"topic": "Tls5", "body": f"secret-{i}"} for i in range(3)]
        client.ok("send", name="p", messages=sent)
        client.ok("simple", name="c", group="GTls5", subs={"Tls5": "*"}, tls=True, **{"await": 5})
        got = client.receive_until(3, within=30)
    finally:
        client.close()
    assert sorted(m["body"] for m in got) == ["secret-0", "secret-1", "secret-2"]


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
