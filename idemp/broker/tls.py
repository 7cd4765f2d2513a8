"""TLS on the remoting ports, as RocketMQ 4.9's servers have it: on by default, beside plain.

RocketMQ's ``HandshakeHandler`` looks at a connection's first byte: 0x16 (a TLS handshake
record; a remoting frame would have to be over 350 MB to start so) gets TLS, anything else
plain remoting. ``tls.server.mode`` is ``permissive`` by default; ``enforcing`` closes plain
connections and ``disabled`` TLS ones. In test mode (``tls.test.mode.enable``, the
default) the server makes a self-signed certificate, which RocketMQ's clients accept in
their own test mode (their default too); otherwise the certificate and key come from
files, checked at start. So a Java service with ``useTLS=true`` (``-Dtls.enable=true``)
works against idemp's broker as it does against RocketMQ's.

A session runs over memory BIOs (``ssl.SSLObject``): the first bytes are already read
when the choice is made, and asyncio's ``start_tls`` cannot be handed them back.
"""

from __future__ import annotations

import datetime
import logging
import ssl
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .config import ConfigError

if TYPE_CHECKING:
    from .config import BrokerConfig

log = logging.getLogger("idemp.broker")

HANDSHAKE_RECORD = 0x16
MODES = ("disabled", "permissive", "enforcing")
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}
_READ = 64 * 1024


class ServerTls:
    """The TLS side of a broker's listeners: the mode, and the context once needed."""

    def __init__(self, cfg: BrokerConfig) -> None:
        self.mode = cfg.tlsServerMode.strip().lower()
        if self.mode not in MODES:
            raise ConfigError(f"tls.server.mode: {cfg.tlsServerMode!r} is not one of {MODES}")
        auth = cfg.tlsServerNeedClientAuth.strip().lower()
        if auth not in _CLIENT_AUTH:
            raise ConfigError(
                f"tls.server.need.client.auth: {cfg.tlsServerNeedClientAuth!r} is not one of "
                f"{tuple(_CLIENT_AUTH)}"
            )
        self._cfg = cfg
        self._auth = _CLIENT_AUTH[auth]
        self._context: ssl.SSLContext | None = None

    def check(self) -> None:
        """At start: a certificate from files must load (a configuration error otherwise);
        the self-signed one of test mode is made at the first TLS client instead, so a
        broker nobody reaches over TLS never pays for an RSA key."""
        if self.mode != "disabled" and not self._cfg.tlsTestModeEnable:
            self.context()

    def context(self) -> ssl.SSLContext:
        if self._context is None:
            ctx = self._files() if not self._cfg.tlsTestModeEnable else _self_signed()
            # gRPC clients (the 5.x endpoint) need HTTP/2 agreed by ALPN, as RocketMQ's
            # proxy offers it; remoting clients offer none, and a client offering only
            # other protocols goes on without one
            ctx.set_alpn_protocols(["h2"])
            self._context = ctx
        return self._context

    def _files(self) -> ssl.SSLContext:
        cfg = self._cfg
        if not cfg.tlsServerCertPath or not cfg.tlsServerKeyPath:
            raise ConfigError(
                "TLS without test mode (tls.test.mode.enable=false) needs tls.server.certPath "
                "and tls.server.keyPath"
            )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(
                cfg.tlsServerCertPath, cfg.tlsServerKeyPath, cfg.tlsServerKeyPassword or None
            )
            if self._auth != ssl.CERT_NONE and cfg.tlsServerTrustCertPath:
                ctx.load_verify_locations(cfg.tlsServerTrustCertPath)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"TLS certificate {cfg.tlsServerCertPath} / key {cfg.tlsServerKeyPath}: {exc}"
            ) from None
        ctx.verify_mode = self._auth
        return ctx

    def session(self) -> TlsSession:
        return TlsSession(self.context())

    def session_for(self, hello: bool, who: str) -> TlsSession | None:
        """RocketMQ's HandshakeHandler, for a connection whose first byte is (``hello``)
        or is not a TLS handshake record: its TLS session, or None for plain. Raises
        TlsRefused, logged with ``who``, when ``tls.server.mode`` closes it instead."""
        if self.mode == ("disabled" if hello else "enforcing"):
            kind = "TLS" if hello else "plain"
            log.warning("%s: a %s client, and tls.server.mode is %s: closed", who, kind, self.mode)
            raise TlsRefused
        if not hello:
            return None
        try:
            return self.session()
        except Exception:  # RocketMQ: "sslContext is null" closes the connection
            log.exception("%s: no TLS context: closed", who)
            raise TlsRefused from None


class TlsRefused(Exception):
    """The connection closes: its first byte does not fit the mode, or no context."""


def _self_signed() -> ssl.SSLContext:
    """Netty's ``SelfSignedCertificate``, as RocketMQ's test mode makes it: RSA 2048,
    CN=localhost, a year; client certificates optional."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=365))
        .sign(key, hashes.SHA256())
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # ssl loads a chain from files only; they live as long as the load takes
    with tempfile.TemporaryDirectory(prefix="idemp-tls-") as tmp:
        cert_file, key_file = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        ctx.load_cert_chain(cert_file, key_file)
    ctx.verify_mode = ssl.CERT_NONE
    log.info("TLS test mode: made a self-signed certificate (CN=localhost)")
    return ctx


class TlsSession:
    """One connection's TLS, sans-IO: bytes from the peer in, plaintext out; plaintext in,
    bytes for the peer out (``take_output`` after every call)."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.established = False  # the handshake is done: application data may go out
        self.closed_by_peer = False

    def receive(self, data: bytes) -> bytes:
        """The plaintext ``data`` completes (often none during the handshake). Raises
        ``ssl.SSLError`` on a failed handshake or a bad record."""
        self._incoming.write(data)
        if not self.established:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                return b""
            self.established = True
        chunks = []
        while True:
            try:
                chunk = self._tls.read(_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the peer's close_notify
                self.closed_by_peer = True
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._tls.write(view) :]

    def take_output(self) -> bytes:
        return self._outgoing.read()
