"""The gRPC server RocketMQ 5 clients connect to, on the broker's own event loop.

gRPC over the endpoint's own HTTP/2 (``http2.py``), so the MessagingService reads and
writes the store as the remoting handlers do, with no lock and no thread hop, and each
connection's writes leave once per turn of the loop. Why not grpc.aio, which served here
before: its writes are one TCP segment per response, each finished before the next may
start, and the 5.x clients pay for every segment; it also spent more of the broker's time
per call than the service did (docs/performance.md, "The receiving gap is paid by the
client").

gRPC on HTTP/2 as its PROTOCOL-HTTP2.md describes it: a call is a stream; the request's
messages and the responses are each a 5-byte prefix (compressed flag, length) and the
bytes; the status goes in the trailers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from google.protobuf.message import DecodeError

from ..tls import HANDSHAKE_RECORD, ServerTls, TlsRefused, TlsSession
from . import http2
from .headerblock import RESPONSE_HEADERS, encode
from .schema import SERVICE
from .service import MessagingService, Rpc

if TYPE_CHECKING:
    from ..context import Broker

log = logging.getLogger("idemp.broker.v5")
REVIVE_INTERVAL_S = 0.5
MAX_MESSAGE_BYTES = 130 * 1024 * 1024  # the proxy's grpcMaxInboundMessageSize
HELD_BYTES_HIGH = 1 << 20  # a stream's writer waits while its peer has more to take
OK, UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = 0, 2, 4, 8
UNIMPLEMENTED, INTERNAL = 12, 13
OK_TRAILERS = encode([("grpc-status", "0")])
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_GZIP = 16 + zlib.MAX_WBITS  # grpc-java's servers decompress gzip only, as RocketMQ's proxy
# methods of the protocol the proxy does not serve: its answer differs from an unknown one's
UNSERVED = ("PullMessage", "UpdateOffset", "GetOffset", "QueryOffset")
_NOT_METADATA = frozenset(("te", "content-type", "grpc-timeout", "grpc-encoding"))


class _Abort(Exception):
    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Call:
    """What the service reads of a call, as grpc.aio's context offers it."""

    __slots__ = ("_metadata", "_deadline", "_peer", "_loop")

    def __init__(
        self, metadata: tuple[tuple[str, str], ...], deadline: float | None, peer: str
    ) -> None:
        self._metadata = metadata
        self._deadline = deadline
        self._peer = peer
        self._loop = asyncio.get_running_loop()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._loop.time())

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: Any, details: str) -> None:
        """``code`` is a ``grpc.StatusCode``; the numbers are the protocol's."""
        raise _Abort(int(code.value[0]), details)


class _Stream:
    """One call in progress."""

    __slots__ = ("rpc", "call", "encoding", "buffer", "task", "requests", "timer", "started")

    def __init__(self, rpc: Rpc, call: Call, encoding: str | None) -> None:
        self.rpc = rpc
        self.call = call
        self.encoding = encoding
        self.buffer = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.requests: asyncio.Queue[Any] | None = None  # a bidi call's, None at the end
        self.timer: asyncio.TimerHandle | None = None
        self.started = False  # response headers sent


class _Connection(asyncio.Protocol):
    def __init__(self, endpoint: GrpcEndpoint) -> None:
        self.endpoint = endpoint
        self.loop = asyncio.get_running_loop()
        self.h2 = http2.ServerConnection(self)
        self.calls: dict[int, _Stream] = {}
        self.waiters: dict[int, asyncio.Future[None]] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.tls: TlsSession | None = None
        self._first_bytes = True  # TLS or plain is decided by the first byte, as remoting
        self._flushing = False
        self._going = False  # the peer sent GOAWAY, or the server stops
        self._idle: asyncio.TimerHandle | None = None  # armed while there is no call

    # --- transport --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        addr = transport.get_extra_info("peername") or ("", 0)
        host, port = addr[0], addr[1]
        self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self.endpoint.connections.add(self)
        self.endpoint.all_closed.clear()
        self._no_calls()
        # the server's SETTINGS wait for the first bytes: they may be a TLS handshake

    def data_received(self, data: bytes) -> None:
        if self._first_bytes and data:
            self._first_bytes = False
            if not self._choose_tls(data[0] == HANDSHAKE_RECORD):
                return
        if self.tls is not None:
            try:
                data = self.tls.receive(data)
            except ssl.SSLError as exc:
                log.info("v5: closing the TLS connection of %s: %s", self.peer, exc)
                self._close_transport()
                return
            if self.tls.closed_by_peer:
                self.close()
                return
            self._schedule(force=True)  # the handshake's answer, at least
            if not data:
                return
        try:
            self.h2.receive(data)
        except http2.ConnectionError_ as exc:
            log.info("v5: closing the connection of %s: %s", self.peer, exc)
            self.close()
            return
        self._schedule()

    def _choose_tls(self, hello: bool) -> bool:
        """As the broker's remoting ports (and RocketMQ's proxy) do, by tls.server.mode;
        False when the connection was closed instead."""
        try:
            self.tls = self.endpoint.tls.session_for(hello, f"v5 {self.peer}")
        except TlsRefused:
            self._close_transport()
            return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.forget(self)
        if self._idle is not None:
            self._idle.cancel()
        for stream in self.calls.values():
            self._cancel(stream)
        self.calls.clear()
        for waiter in self.waiters.values():
            if not waiter.done():
                waiter.set_result(None)

    def _schedule(self, *, force: bool = False) -> None:
        if not self._flushing and (self.h2.out or force):
            self._flushing = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        transport = self.transport
        if self._first_bytes or transport is None or transport.is_closing():
            return
        tls = self.tls
        if tls is None:
            data = self.h2.data_to_send()
        else:
            if tls.established and self.h2.out:
                tls.send(self.h2.data_to_send())
            data = tls.take_output()
        if data:
            transport.write(data)
        if self._going and not self.calls:
            transport.close()

    def close(self) -> None:
        self._flush()
        self._close_transport()

    def _close_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def shutdown(self, why: str = "") -> None:
        """No more calls: GOAWAY now (``why`` its debug data), the close once the calls
        in progress end."""
        self._going = True
        self.h2.goaway(http2.NO_ERROR, why)
        self._schedule()
        if not self.calls:
            self.loop.call_soon(self.close)

    # --- events of the HTTP/2 connection ----------------------------------------------
    def request(self, stream_id: int, headers: list[tuple[str, str]], ended: bool) -> None:
        path = method = content_type = timeout = encoding = None
        metadata = []
        for name, value in headers:
            if name[0] == ":":
                if name == ":path":
                    path = value
                elif name == ":method":
                    method = value
            elif name in _NOT_METADATA:
                if name == "content-type":
                    content_type = value
                elif name == "grpc-timeout":
                    timeout = value
                elif name == "grpc-encoding":
                    encoding = value
            else:
                metadata.append((name, value))
        if method != "POST" or not (content_type or "").startswith("application/grpc"):
            # not gRPC: HTTP's own refusal, as grpc-java's server gives it
            status = "405" if method != "POST" else "415"
            self.h2.send_headers(stream_id, encode([(":status", status)]), end=True)
            return
        rpc = self.endpoint.rpcs.get(path or "")
        if rpc is None:
            full = (path or "")[1:]
            service, _, name = full.rpartition("/")
            if service == SERVICE and name in UNSERVED:
                refusal = f"Method {full} is unimplemented"
            else:
                refusal = f"Method not found: {full}"
            self._trailers_only(stream_id, UNIMPLEMENTED, refusal)
            return
        if encoding == "identity":
            encoding = None
        elif encoding is not None and encoding != "gzip":
            self._trailers_only(stream_id, UNIMPLEMENTED, f"Can't find decompressor for {encoding}")
            return
        deadline = None
        if timeout is not None:
            seconds = _timeout(timeout)
            if seconds is None:
                self._trailers_only(stream_id, INTERNAL, f"Invalid grpc-timeout: {timeout}")
                return
            deadline = self.loop.time() + seconds
        stream = _Stream(rpc, Call(tuple(metadata), deadline, self.peer), encoding)
        self.calls[stream_id] = stream
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if deadline is not None:
            stream.timer = self.loop.call_at(deadline, self._expired, stream_id)
        if rpc.kind == "bidi":
            stream.requests = asyncio.Queue()
            stream.task = self.loop.create_task(self._bidi(stream_id, stream))
        if ended:
            self.data(stream_id, b"", True)

    def data(self, stream_id: int, data: bytes, ended: bool) -> None:
        stream = self.calls.get(stream_id)
        if stream is None:
            return
        buffer = stream.buffer
        if data:
            buffer += data
        while len(buffer) >= 5:
            length = int.from_bytes(buffer[1:5], "big")
            if length > MAX_MESSAGE_BYTES:
                self._end(
                    stream_id,
                    RESOURCE_EXHAUSTED,
                    f"gRPC message larger than max ({length} vs. {MAX_MESSAGE_BYTES})",
                )
                return
            if len(buffer) < 5 + length:
                break
            compressed = buffer[0]
            payload = bytes(buffer[5 : 5 + length])
            del buffer[: 5 + length]
            if compressed:
                if stream.encoding is None:
                    self._end(stream_id, INTERNAL, "a compressed message without grpc-encoding")
                    return
                try:
                    payload = zlib.decompress(payload, _GZIP)
                except zlib.error as exc:
                    self._end(stream_id, INTERNAL, f"cannot decompress the message: {exc}")
                    return
            if not self._message(stream_id, stream, payload):
                return
        if ended:
            if buffer:
                self._end(stream_id, INTERNAL, "the stream ended inside a message")
            elif stream.requests is not None:
                stream.requests.put_nowait(None)
            elif stream.task is None:
                self._end(stream_id, INTERNAL, "Half-closed without a request")

    def _message(self, stream_id: int, stream: _Stream, payload: bytes) -> bool:
        try:
            request = stream.rpc.request.FromString(payload)
        except DecodeError:
            self._end(stream_id, UNKNOWN, "")  # grpc-java sends no description then
            return False
        if stream.requests is not None:
            stream.requests.put_nowait(request)
        elif stream.task is None:
            run = self._unary if stream.rpc.kind == "unary" else self._server_stream
            stream.task = self.loop.create_task(run(stream_id, stream, request))
        else:
            self._end(stream_id, INTERNAL, "Too many requests")
            return False
        return True

    def reset(self, stream_id: int, code: int) -> None:
        stream = self.calls.pop(stream_id, None)
        if stream is not None:
            self._cancel(stream)
            if not self.calls:
                self._no_calls()
        self._wake(stream_id)

    def drained(self, stream_id: int) -> None:
        self._wake(stream_id)

    def goaway(self) -> None:
        self._going = True
        if not self.calls:
            self.loop.call_soon(self.close)

    # --- calls ------------------------------------------------------------------------
    async def _unary(self, stream_id: int, stream: _Stream, request: Any) -> None:
        try:
            response = await stream.rpc.fn(request, stream.call)
            framed = _framed(response)
        except Exception as exc:
            self._failed(stream_id, stream, exc)
            return
        if self.calls.get(stream_id) is not stream:
            return  # reset or expired meanwhile
        h2 = self.h2
        h2.send_headers(stream_id, RESPONSE_HEADERS)
        h2.send_data(stream_id, framed)
        h2.send_headers(stream_id, OK_TRAILERS, end=True)
        self._done(stream_id, stream)

    async def _server_stream(self, stream_id: int, stream: _Stream, request: Any) -> None:
        await self._respond(stream_id, stream, stream.rpc.fn(request, stream.call))

    async def _bidi(self, stream_id: int, stream: _Stream) -> None:
        queue = stream.requests
        assert queue is not None

        async def requests() -> AsyncIterator[Any]:
            while (request := await queue.get()) is not None:
                yield request

        await self._respond(stream_id, stream, stream.rpc.fn(requests(), stream.call))

    async def _respond(self, stream_id: int, stream: _Stream, responses: Any) -> None:
        h2 = self.h2
        try:
            async for response in responses:
                if self.calls.get(stream_id) is not stream:
                    return
                if not stream.started:
                    stream.started = True
                    h2.send_headers(stream_id, RESPONSE_HEADERS)
                held = h2.send_data(stream_id, _framed(response))
                self._schedule()
                if held > HELD_BYTES_HIGH:
                    waiter = self.waiters[stream_id] = self.loop.create_future()
                    await waiter
        except Exception as exc:
            self._failed(stream_id, stream, exc)
            return
        finally:
            await responses.aclose()
        self._end(stream_id, OK, "")

    def _failed(self, stream_id: int, stream: _Stream, exc: Exception) -> None:
        """An abort is the status the service chose; anything else is a bug, logged, and
        UNKNOWN for the client, as grpc's servers answer it."""
        if isinstance(exc, _Abort):
            self._end(stream_id, exc.code, exc.details)
            return
        log.error("v5: %s failed", stream.rpc.fn, exc_info=exc)
        self._end(stream_id, UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")

    def _end(self, stream_id: int, code: int, details: str) -> None:
        """The call's status: trailers after the responses sent, or alone."""
        stream = self.calls.get(stream_id)
        if stream is None:
            return
        if stream.started:
            self.h2.send_headers(stream_id, _trailers(code, details), end=True)
        else:
            self.h2.send_headers(stream_id, RESPONSE_HEADERS + _trailers(code, details), end=True)
        self._done(stream_id, stream)
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()

    def _trailers_only(self, stream_id: int, code: int, details: str) -> None:
        self.h2.send_headers(stream_id, RESPONSE_HEADERS + _trailers(code, details), end=True)

    def _done(self, stream_id: int, stream: _Stream) -> None:
        del self.calls[stream_id]
        if stream.timer is not None:
            stream.timer.cancel()
        self._schedule()
        if not self.calls:
            if self._going:
                self.loop.call_soon(self.close)
            else:
                self._no_calls()

    def _no_calls(self) -> None:
        """The proxy's grpcClientIdleTimeMills (grpc-java's maxConnectionIdle): a
        connection left without a call that long is sent away."""
        if self._idle is None:
            self._idle = self.loop.call_later(self.endpoint.idle_s, self._idle_out)

    def _idle_out(self) -> None:
        self._idle = None
        if not self.calls:
            log.info("v5 %s: no call for %.0f s: GOAWAY", self.peer, self.endpoint.idle_s)
            self.shutdown("max_idle")  # grpc-java's words, measured on RocketMQ 5.3.3

    def _expired(self, stream_id: int) -> None:
        stream = self.calls.get(stream_id)
        if stream is not None:
            stream.timer = None
            self._end(stream_id, DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _cancel(self, stream: _Stream) -> None:
        if stream.task is not None:
            stream.task.cancel()
        if stream.timer is not None:
            stream.timer.cancel()

    def _wake(self, stream_id: int) -> None:
        waiter = self.waiters.pop(stream_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _framed(message: Any) -> bytes:
    payload = message.SerializeToString()
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def _trailers(code: int, details: str) -> bytes:
    fields = [("grpc-status", str(code))]
    if details:
        # gRPC's percent-encoding: printable ASCII but '%' as is, the rest as UTF-8 %XX
        fields.append(("grpc-message", quote(details, safe=_PRINTABLE)))
    return encode(fields)


_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def _timeout(value: str) -> float | None:
    """grpc-timeout: up to 8 digits and a unit."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


async def listen_avoiding(
    listen: Callable[[], Awaitable[asyncio.Server]], avoid: int, tries: int = 8
) -> asyncio.Server:
    """A server on a free port other than ``avoid`` (the system may hand out any free
    one; a few tries, then what it gives)."""
    for _ in range(tries - 1):
        server = await listen()
        if server.sockets[0].getsockname()[1] != avoid:
            return server
        server.close()
        await server.wait_closed()
    return await listen()


class GrpcEndpoint:
    def __init__(self, broker: Broker) -> None:
        self.service = MessagingService(broker)
        self.rpcs = {f"/{SERVICE}/{name}": rpc for name, rpc in self.service.rpcs().items()}
        self.server: asyncio.Server | None = None
        self.tls: ServerTls = broker.tls  # shared with the remoting ports
        self.idle_s = broker.config.grpcClientIdleTimeMills / 1000
        self.connections: set[_Connection] = set()
        self.all_closed = asyncio.Event()
        self._revive: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, avoid: int = -1) -> int:
        """``avoid``: a port a free one (``port`` 0) must not be, as the broker's VIP
        channel takes it when the broker starts again on its listenPort, asking for this
        same gRPC port."""
        loop = asyncio.get_running_loop()

        async def listen() -> asyncio.Server:
            return await loop.create_server(
                lambda: _Connection(self), host or None, port, reuse_address=True
            )

        try:
            server = await listen() if port else await listen_avoiding(listen, avoid)
        except OSError as exc:
            raise OSError(
                f"cannot listen on {host}:{port} for gRPC (grpcServerPort): {exc}"
            ) from None
        bound = int(server.sockets[0].getsockname()[1])
        self.server = server
        self.service.endpoint = (self.service.endpoint[0], bound)
        self._revive = loop.create_task(self._revive_loop())
        return bound

    async def _revive_loop(self) -> None:
        service = self.service
        while True:
            if not service.clients and not service.pop.pending():
                # nothing in flight and no client to expire: wait for one
                service.client_arrived.clear()
                await service.client_arrived.wait()
            await asyncio.sleep(REVIVE_INTERVAL_S)
            try:
                service.pop.renew(service.alive)
                service.pop.revive()
                service.expire_clients()
            except Exception:  # pragma: no cover - a bug must not stop redelivery
                log.exception("v5: revive failed")

    def forget(self, connection: _Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self.all_closed.set()

    async def stop(self, grace: float = 0.5) -> None:
        """GOAWAY to every client; calls in progress get ``grace`` seconds to end (a
        Telemetry stream never does), then the connections close."""
        if self._revive is not None:
            self._revive.cancel()
        self.service.cluster.close()
        self.service.pop.close()
        if self.server is None:
            return
        self.server.close()
        for connection in list(self.connections):
            connection.shutdown()
        if self.connections:
            try:
                await asyncio.wait_for(self.all_closed.wait(), grace)
            except asyncio.TimeoutError:
                for connection in list(self.connections):
                    connection.close()
        self.server = None
