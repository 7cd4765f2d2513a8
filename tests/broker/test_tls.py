"""TLS on the broker's remoting ports, as RocketMQ 4.9.7 has it (measured side by side: a
4.9.7 nameserver and broker in their default configuration answer TLS clients with a
self-signed certificate, and plain ones on the same ports; the Java client with
``setUseTLS(true)`` sends and consumes on both, see interop/features.expected)."""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from idemp.broker.process import BrokerProcess, BrokerStartError
from idemp.remoting import RemotingCommand, RequestCode, ResponseCode

from .rawclient import ConnectionClosed, RawClient


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def route_over_tls(addr: str, ctx: ssl.SSLContext | None = None) -> tuple[RemotingCommand, bytes]:
    """A route request over TLS; its answer and the server's certificate (DER)."""
    with RawClient(addr, tls=ctx or _insecure()) as c:
        cert = c.sock.getpeercert(binary_form=True)  # type: ignore[attr-defined]
        assert cert is not None
        return c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"}), cert


def closed_without_answer(addr: str, tls: bool) -> bool:
    """A request on a new connection that the broker closes unanswered."""
    try:
        with RawClient(addr, tls=_insecure() if tls else None) as c:
            c.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"})
    except (ConnectionClosed, ssl.SSLError, ConnectionResetError):
        return True
    return False


@pytest.mark.idemp_only("idemp's log lines")
def test_tls_and_plain_clients_on_the_same_ports_by_default(broker: BrokerProcess) -> None:
    for addr in (broker.namesrv_addr, broker.broker_addr):
        answer, der = route_over_tls(addr)
        expected = (
            ResponseCode.TOPIC_NOT_EXIST
            if addr == broker.namesrv_addr
            else ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        )
        assert answer.code == expected, answer.remark
        cert = x509.load_der_x509_certificate(der)
        # RocketMQ's test mode: Netty's SelfSignedCertificate (RSA 2048, CN=localhost)
        assert cert.subject == cert.issuer
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "localhost"
        assert cert.public_key().key_size == 2048  # type: ignore[union-attr]
        with RawClient(addr) as plain:
            assert plain.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "X"}).code in (
                ResponseCode.TOPIC_NOT_EXIST,
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            )
    # one certificate for the process, made at the first TLS client
    assert route_over_tls(broker.broker_addr)[1] == der
    assert broker.log_path.read_text().count("made a self-signed certificate") == 1


def test_a_message_larger_than_a_tls_record(broker: BrokerProcess) -> None:
    """A send of 1 MiB crosses many 16 KiB records each way: stored and read back whole."""
    body = bytes(range(256)) * 4096
    with RawClient(broker.broker_addr, tls=_insecure()) as c:
        sent = c.send_message("TlsBig", body)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        (pulled,) = c.pull_messages("TlsBig")
    assert pulled.body == body


@pytest.mark.idemp_only("idemp's log lines")
def test_enforcing_closes_plain_clients(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker(**{"tls.server.mode": "enforcing"})
    assert closed_without_answer(broker.broker_addr, tls=False)
    assert closed_without_answer(broker.namesrv_addr, tls=False)
    assert route_over_tls(broker.namesrv_addr)[0].code == (ResponseCode.TOPIC_NOT_EXIST)
    assert "a plain client, and tls.server.mode is enforcing: closed" in broker.log_path.read_text()


@pytest.mark.idemp_only("idemp's log lines")
def test_disabled_closes_tls_clients(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker(**{"tls.server.mode": "disabled"})
    assert closed_without_answer(broker.broker_addr, tls=True)
    with RawClient(broker.namesrv_addr) as plain:
        assert plain.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "X"}).code == (
            ResponseCode.TOPIC_NOT_EXIST
        )
    assert "a TLS client, and tls.server.mode is disabled: closed" in broker.log_path.read_text()


def write_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate and its key (it is its own CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.mark.idemp_only("idemp's log lines")
def test_a_certificate_from_files(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    cert, key = write_certificate(tmp_path, "broker.example")
    broker = make_broker(
        **{
            "tls.test.mode.enable": "false",
            "tls.server.certPath": str(cert),
            "tls.server.keyPath": str(key),
        }
    )
    verified = ssl.create_default_context(cafile=str(cert))
    verified.check_hostname = False
    answer, der = route_over_tls(broker.namesrv_addr, verified)
    assert answer.code == ResponseCode.TOPIC_NOT_EXIST
    assert der == x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(
        serialization.Encoding.DER
    )
    assert "self-signed" not in broker.log_path.read_text()


@pytest.mark.idemp_only("idemp's checks of its settings")
@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"tls.server.mode": "strict"}, "tls.server.mode: 'strict' is not one of"),
        ({"tls.server.need.client.auth": "maybe"}, "tls.server.need.client.auth: 'maybe'"),
        (
            {"tls.test.mode.enable": "false"},
            "TLS without test mode (tls.test.mode.enable=false) needs tls.server.certPath",
        ),
        (
            {
                "tls.test.mode.enable": "false",
                "tls.server.certPath": "/nonexistent/cert.pem",
                "tls.server.keyPath": "/nonexistent/key.pem",
            },
            "TLS certificate /nonexistent/cert.pem / key /nonexistent/key.pem:",
        ),
    ],
)
def test_bad_tls_settings_stop_the_start(
    make_broker: Callable[..., BrokerProcess], props: dict[str, str], message: str
) -> None:
    with pytest.raises(BrokerStartError) as failed:
        make_broker(**props)
    assert message in str(failed.value)


def test_tls_settings_are_not_broker_config_keys(broker: BrokerProcess) -> None:
    """RocketMQ reads them as system properties: GET_BROKER_CONFIG does not list them."""
    with RawClient(broker.broker_addr) as c:
        body = c.request(RequestCode.GET_BROKER_CONFIG).body.decode()
    keys = [line.split("=", 1)[0] for line in body.splitlines()]
    assert [k for k in keys if "tls" in k.lower()] == ["useTLS"]  # RocketMQ's own, false
    assert "useTLS=false" in body.splitlines()
