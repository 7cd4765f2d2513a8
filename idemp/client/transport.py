"""asyncio connections to nameservers and brokers.

One ``Transport`` per process: responses are matched by opaque across all its
connections (a C++-style peer may answer on another socket), connections are opened
on demand and reopened after a loss, and requests the server sends us
(CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED, ...) go to one handler.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, Union

from idemp.remoting import FrameDecoder, ProtocolError, RemotingCommand, ResponseCode, encode
from idemp.remoting.codes import RPC_ONEWAY, RPC_TYPE_RESPONSE
from idemp.waiting import within

__all__ = ["within"]  # also the client's: its modules import it from here

log = logging.getLogger("idemp.client.transport")

RequestHandler = Callable[
    ["Connection", RemotingCommand],
    Union[RemotingCommand, None, Awaitable[Union[RemotingCommand, None]]],  # noqa: UP007
]

T = TypeVar("T")

# Java: a global AtomicInteger; masked to stay a positive int32 on the wire.
_OPAQUES = itertools.count(1)


class _Expired(Exception):
    """A request's deadline passed (set on its future by its timer)."""


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


def next_opaque() -> int:
    return next(_OPAQUES) & 0x7FFFFFFF


class RemotingError(Exception):
    """A request could not be completed (connection, timeout or an error answer)."""


class ConnectError(RemotingError):
    pass


class RequestTimeout(RemotingError):
    pass


class ConnectionLost(RemotingError):
    pass


class ResponseError(RemotingError):
    """The server answered with a code the caller does not accept."""

    def __init__(self, code: int, remark: str | None, what: str = "") -> None:
        self.code = code
        self.remark = remark or ""
        name = ResponseCode(code).name if code in ResponseCode._value2member_map_ else str(code)
        super().__init__(f"{what}{': ' if what else ''}{name} ({code}) {self.remark}".strip())


class Connection(asyncio.Protocol):
    def __init__(self, owner: Transport, addr: str) -> None:
        self.owner = owner
        self.addr = addr
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.opaques: set[int] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.owner._lost(self, exc)

    def data_received(self, data: bytes) -> None:
        try:
            commands = self.decoder.feed(data)
        except ProtocolError as exc:
            log.warning("%s: protocol error, closing: %s", self.addr, exc)
            self.close()
            return
        for cmd in commands:
            if cmd.is_response:
                self.owner._response(cmd)
            else:
                self.owner._server_request(self, cmd)

    def send(self, cmd: RemotingCommand) -> None:
        if self.closed or self.transport is None:
            raise ConnectionLost(f"connection to {self.addr} is closed")
        self.transport.write(encode(cmd))

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()


class Transport:
    def __init__(
        self,
        *,
        language: str = "PYTHON",
        version: int = 407,
        connect_timeout: float = 3.0,
        on_request: RequestHandler | None = None,
        sign: Callable[[RemotingCommand], None] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.language = language
        self.tls = tls  # every connection over TLS (the Java client's useTLS)
        self.sign = sign  # ACL: adds AccessKey and Signature to every request sent
        self.version = version
        self.connect_timeout = connect_timeout
        self.on_request = on_request
        self._conns: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._pending: dict[int, tuple[asyncio.Future[RemotingCommand], Connection]] = {}
        self._closed = False

    # --- connections -------------------------------------------------------------
    async def connection(self, addr: str) -> Connection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise ConnectError("transport is closed")
        waiting = self._connecting.get(addr)
        if waiting is not None:
            return await asyncio.shield(waiting)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Connection] = loop.create_future()
        self._connecting[addr] = fut
        try:
            host, _, port = addr.rpartition(":")
            try:
                _, proto = await within(
                    loop.create_connection(
                        lambda: Connection(self, addr), host, int(port), ssl=self.tls
                    ),
                    self.connect_timeout,
                )
            except (OSError, asyncio.TimeoutError, ValueError) as exc:
                err = ConnectError(f"cannot connect to {addr}: {exc or type(exc).__name__}")
                fut.set_exception(err)
                fut.exception()  # retrieved: waiters re-raise it
                raise err from None
            self._conns[addr] = proto
            fut.set_result(proto)
            return proto
        finally:
            self._connecting.pop(addr, None)

    def close_connection(self, addr: str) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._closed = True
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()

    # --- requests ----------------------------------------------------------------
    def request(
        self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        return RemotingCommand(
            code=code,
            opaque=next_opaque(),
            language=self.language,
            version=self.version,
            ext_fields=ext_fields or {},
            body=body,
        )

    async def _connected(self, addr: str, timeout: float) -> Connection:
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:  # the common case: no task, no wait
            return conn
        try:
            return await within(self.connection(addr), timeout)
        except asyncio.TimeoutError:
            raise ConnectError(f"cannot connect to {addr} within {timeout:.1f}s") from None

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``cmd`` and wait for its response (any code); raise on transport trouble.

        The response future is awaited directly, its deadline a timer that fails it:
        ``within`` (a task and ``asyncio.wait`` for both awaits) made a request cost the
        client ~30 % more CPU, paid by every pull, offset commit and send-back."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await self._connected(addr, timeout)
        fut: asyncio.Future[RemotingCommand] = loop.create_future()
        self._pending[cmd.opaque] = (fut, conn)
        conn.opaques.add(cmd.opaque)
        timer: asyncio.TimerHandle | None = None
        if self.sign is not None:
            self.sign(cmd)
        try:
            conn.send(cmd)
            timer = loop.call_at(max(deadline, loop.time() + 0.001), _expire, fut)
            try:
                return await fut
            except _Expired:
                raise RequestTimeout(
                    f"request code {cmd.code} to {addr} timed out after {timeout:.1f}s"
                ) from None
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(cmd.opaque, None)
            conn.opaques.discard(cmd.opaque)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> None:
        cmd.flag |= RPC_ONEWAY
        conn = await self._connected(addr, timeout)
        if self.sign is not None:
            self.sign(cmd)
        conn.send(cmd)

    # --- events from connections -------------------------------------------------
    def _response(self, cmd: RemotingCommand) -> None:
        entry = self._pending.get(cmd.opaque)
        if entry is None:
            return  # late answer to a timed-out request
        fut = entry[0]
        if not fut.done():
            fut.set_result(cmd)

    def _lost(self, conn: Connection, exc: Exception | None) -> None:
        if self._conns.get(conn.addr) is conn:
            del self._conns[conn.addr]
        for opaque in list(conn.opaques):
            entry = self._pending.get(opaque)
            if entry is not None and not entry[0].done():
                entry[0].set_exception(ConnectionLost(f"connection to {conn.addr} lost"))

    def _server_request(self, conn: Connection, cmd: RemotingCommand) -> None:
        handler = self.on_request
        if handler is None:
            return
        try:
            result = handler(conn, cmd)
        except Exception:
            log.exception("%s: server request code %d failed", conn.addr, cmd.code)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(lambda t: self._answer(conn, cmd, t))
        else:
            self._reply(conn, cmd, result)

    def _answer(
        self, conn: Connection, cmd: RemotingCommand, task: asyncio.Future[RemotingCommand | None]
    ) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error(
                "%s: server request code %d failed: %s", conn.addr, cmd.code, task.exception()
            )
            return
        self._reply(conn, cmd, task.result())

    def _reply(
        self, conn: Connection, cmd: RemotingCommand, result: RemotingCommand | None
    ) -> None:
        if result is None or cmd.is_oneway:
            return
        result.opaque = cmd.opaque
        result.flag |= RPC_TYPE_RESPONSE
        result.language = self.language
        result.version = self.version
        try:
            conn.send(result)
        except ConnectionLost:
            pass
