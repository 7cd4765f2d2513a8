"""idemp's client over TLS (``use_tls``, the Java client's ``useTLS``) against a broker
that enforces it: sends and consumption as in plain, the server's certificate checked
against a CA file when one is given, and a clear error at start when TLS does not fit."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from idemp import App
from idemp.broker.process import BrokerProcess
from idemp.client import (
    ClientSettings,
    ConnectError,
    ConsumeFrom,
    ConsumerSettings,
    OutMessage,
    Producer,
    ProducerSettings,
    SendStatus,
)
from idemp.client.transport import RemotingError
from idemp.message import ConsumeResult, Message
from idemp.runners import ConcurrentRunner
from tests.broker.test_tls import write_certificate
from tests.client.conftest import wait_for

FAST = dict(rebalance_interval=1.0, persist_offset_interval=0.5)


def settings(broker: BrokerProcess, **kw: object) -> ClientSettings:
    return ClientSettings(namesrv_addr=broker.namesrv_addr, **FAST, **kw)  # type: ignore[arg-type]


def runner(broker: BrokerProcess, group: str, sink: list[bytes], **kw: object) -> ConcurrentRunner:
    lock = threading.Lock()

    def listener(message: Message) -> ConsumeResult:
        with lock:
            sink.append(message.body)
        return ConsumeResult.SUCCESS

    r = ConcurrentRunner(
        listener,
        settings=ConsumerSettings(group=group, consume_from=ConsumeFrom.FIRST_OFFSET),
        client=settings(broker, **kw),
    )
    r.subscribe("TlsOrders")
    return r


def test_send_and_consume_over_tls(make_broker: Callable[..., BrokerProcess]) -> None:
    broker = make_broker(**{"tls.server.mode": "enforcing"})
    big = os.urandom(1 << 20)  # incompressible: 1 MiB on the wire, many TLS records
    bodies = [b"t0", b"t1", big, b"t3"]
    producer = Producer(
        settings=ProducerSettings(group="tls-p"), client=settings(broker, use_tls=True)
    ).start()
    try:
        results = [producer.send(OutMessage("TlsOrders", b)) for b in bodies]
    finally:
        producer.shutdown()
    assert {r.status for r in results} == {SendStatus.SEND_OK}
    got: list[bytes] = []
    r = runner(broker, "tls-g", got, use_tls=True)
    r.start()
    try:
        wait_for(lambda: len(got) == 4, 30, "4 messages over TLS")
    finally:
        r.shutdown()
    assert sorted(got) == sorted(bodies)

    plain: list[bytes] = []
    refused = runner(broker, "plain-g", plain)
    with pytest.raises(RemotingError, match=r"connection to .* lost"):
        refused.start()  # enforcing: the broker closes a plain client's connection
    refused.shutdown()


def test_the_servers_certificate_is_checked_against_a_ca_file(
    make_broker: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    cert, key = write_certificate(tmp_path, "broker.example")
    other, _ = write_certificate(tmp_path, "someone.else")
    broker = make_broker(
        **{
            "tls.server.mode": "enforcing",
            "tls.test.mode.enable": "false",
            "tls.server.certPath": str(cert),
            "tls.server.keyPath": str(key),
        }
    )
    producer = Producer(
        settings=ProducerSettings(group="ca-p"),
        client=settings(broker, use_tls=True, tls_ca_file=str(cert)),
    ).start()
    try:
        assert producer.send(OutMessage("TlsOrders", b"x")).status == SendStatus.SEND_OK
    finally:
        producer.shutdown()
    got: list[bytes] = []
    untrusted = runner(broker, "ca-g", got, use_tls=True, tls_ca_file=str(other))
    with pytest.raises(ConnectError, match="certificate verify failed"):
        untrusted.start()
    untrusted.shutdown()
    assert got == []


def test_tls_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IDEMP_USE_TLS", "true")
    assert ClientSettings(namesrv_addr="x:1").tls_context() is not None
    monkeypatch.setenv("IDEMP_USE_TLS", "false")
    assert ClientSettings(namesrv_addr="x:1").tls_context() is None
    missing = tmp_path / "missing.pem"
    with pytest.raises(ValueError, match="TLS files of the client settings"):
        ClientSettings(namesrv_addr="x:1", use_tls=True, tls_ca_file=str(missing)).tls_context()


def test_an_app_over_tls_by_its_settings(
    make_broker: Callable[..., BrokerProcess], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``IDEMP_USE_TLS=true`` (or ``use_tls`` in the settings file): an App's listeners and
    idemp's tools talk TLS to a broker that takes nothing else."""
    broker = make_broker(**{"tls.server.mode": "enforcing"})
    monkeypatch.setenv("IDEMP_USE_TLS", "true")
    producer = Producer(broker.namesrv_addr, "tls-app-p").start()
    try:
        for key in ("a1", "a2", "a2"):
            producer.send(OutMessage("TlsOrders", key.encode(), keys=[key]))
    finally:
        producer.shutdown()
    applied: list[str] = []
    app = App("tls-app", namesrv_addr=broker.namesrv_addr)

    @app.listener(
        "TlsOrders",
        group="tls-app",
        strategy=f"sqlite:///{tmp_path / 'dedup.db'}",
        consume_from=ConsumeFrom.FIRST_OFFSET,
    )
    def on_order(message: Message) -> None:
        applied.append(message.keys[0])

    app.start()
    try:
        wait_for(lambda: sorted(applied) == ["a1", "a2"], 30, "a1 and a2 applied once each")
    finally:
        app.stop()
    assert sorted(applied) == ["a1", "a2"]
