"""The server side of an HTTP/2 connection (RFC 9113), sans-IO, as much of it as gRPC uses.

Bytes go in through ``receive``, and what the peer asked for arrives at the ``Events``
callbacks; what the server says goes out through ``data_to_send``, which the endpoint calls
once per turn of its event loop. That last point is why this exists: a receive answers with
34 responses and a consumer's acks arrive together, and grpc's Python servers write each
response in its own TCP segment, which the 5.x client pays for (docs/performance.md). Here
all that is ready leaves in one write, as RocketMQ's proxy (grpc-java on Netty) does.

Not served: server push, priorities (read and ignored), the Upgrade from HTTP/1.1.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from .headerblock import HeaderDecoder, HeaderError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

S_ENABLE_PUSH = 0x2
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
# What the endpoint lets a client send ahead, per stream and in all: grpc-java's default
# flow-control window (1 MiB); it is given back as soon as the bytes are read.
RECEIVE_WINDOW = 1 << 20
MAX_HEADER_BLOCK = 1 << 20  # a header block longer than this ends the connection

_FRAME = struct.Struct(">I")  # the high byte holds the length's first octet
_SETTING = struct.Struct(">HI")


class ConnectionError_(Exception):  # noqa: N801 - the builtin's name is taken
    """The connection cannot go on: a GOAWAY with ``code`` is queued, then it closes."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Events(Protocol):
    """What the connection reports; each is called from within ``receive``."""

    def request(self, stream_id: int, headers: list[tuple[str, str]], ended: bool) -> None: ...

    def data(self, stream_id: int, data: bytes, ended: bool) -> None: ...

    def reset(self, stream_id: int, code: int) -> None:
        """The peer cancelled the stream, or it broke a rule of its own."""

    def drained(self, stream_id: int) -> None:
        """What was held back for lack of window has been sent."""

    def goaway(self) -> None:
        """The peer opens no more streams; the connection ends when its streams do."""


@dataclass(slots=True)
class _Stream:
    window: int  # what the server may still send
    unacked: int = 0  # what was received and not yet given back by a WINDOW_UPDATE
    remote_open: bool = True
    held: deque[tuple[int, bytes, int]] = field(default_factory=deque)  # type, payload, flags
    held_bytes: int = 0


class ServerConnection:
    def __init__(self, events: Events) -> None:
        self.events = events
        self.headers = HeaderDecoder()
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0
        self.out: list[bytes] = []
        self.closed = False  # after a GOAWAY was sent
        self._buffer = bytearray()
        self._preface = False
        self._block: tuple[int, int, list[bytes]] | None = None  # stream, flags, fragments
        self._window = DEFAULT_WINDOW  # connection-level, for what the server sends
        self._unacked = 0
        self._initial = DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self._frame_max = DEFAULT_FRAME  # the peer's SETTINGS_MAX_FRAME_SIZE
        self._frame(
            SETTINGS,
            0,
            0,
            _SETTING.pack(S_INITIAL_WINDOW_SIZE, RECEIVE_WINDOW)
            + _SETTING.pack(S_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK),
        )
        self._frame(WINDOW_UPDATE, 0, 0, _FRAME.pack(RECEIVE_WINDOW - DEFAULT_WINDOW))

    # --- out --------------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        out = b"".join(self.out)
        self.out.clear()
        return out

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        self.out.append(
            _FRAME.pack(len(payload))[1:] + bytes((kind, flags)) + _FRAME.pack(stream_id) + payload
        )

    def send_headers(self, stream_id: int, block: bytes, *, end: bool = False) -> None:
        """HEADERS (trailers when ``end``), after whatever the stream still holds back."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        flags = END_STREAM if end else 0
        if stream.held:
            stream.held.append((HEADERS, block, flags))
        else:
            self._headers(stream_id, block, flags)
            if end:
                self._ended(stream_id, stream)

    def _headers(self, stream_id: int, block: bytes, flags: int) -> None:
        limit = self._frame_max
        if len(block) <= limit:
            self._frame(HEADERS, flags | END_HEADERS, stream_id, block)
            return
        self._frame(HEADERS, flags, stream_id, block[:limit])
        for at in range(limit, len(block), limit):
            last = at + limit >= len(block)
            self._frame(CONTINUATION, END_HEADERS if last else 0, stream_id, block[at : at + limit])

    def send_data(self, stream_id: int, data: bytes) -> int:
        """DATA, as far as the windows allow; the rest is held until they open. Returns
        what the stream holds back, so a writer can wait for ``drained``."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return 0
        if stream.held:
            stream.held.append((DATA, data, 0))
            stream.held_bytes += len(data)
            return stream.held_bytes
        rest = self._data(stream_id, stream, data)
        if rest:
            stream.held.append((DATA, rest, 0))
            stream.held_bytes += len(rest)
        return stream.held_bytes

    def _data(self, stream_id: int, stream: _Stream, data: bytes) -> bytes:
        """Sends what the windows take of ``data``; returns the rest."""
        frame_max = self._frame_max
        while data:
            room = min(stream.window, self._window, frame_max)
            if room <= 0:
                return data
            chunk, data = data[:room], data[room:]
            stream.window -= len(chunk)
            self._window -= len(chunk)
            self._frame(DATA, 0, stream_id, chunk)
        return b""

    def reset_stream(self, stream_id: int, code: int) -> None:
        if self.streams.pop(stream_id, None) is not None:
            self._frame(RST_STREAM, 0, stream_id, _FRAME.pack(code))

    def goaway(self, code: int = NO_ERROR, message: str = "") -> None:
        if not self.closed:
            self.closed = True
            self._frame(
                GOAWAY, 0, 0, _FRAME.pack(self.last_stream) + _FRAME.pack(code) + message.encode()
            )

    def _ended(self, stream_id: int, stream: _Stream) -> None:
        """The server's side is done: the stream is gone, and if the client is still
        sending (a request refused early), it is told to stop (RFC 9113 §8.1)."""
        del self.streams[stream_id]
        if stream.remote_open:
            self._frame(RST_STREAM, 0, stream_id, _FRAME.pack(NO_ERROR))

    def _release(self, stream_id: int, stream: _Stream) -> None:
        """Sends what the stream held back, as far as the windows now allow."""
        held = stream.held
        while held:
            kind, payload, flags = held[0]
            if kind == HEADERS:
                held.popleft()
                self._headers(stream_id, payload, flags)
                if flags & END_STREAM:
                    self._ended(stream_id, stream)
                    return
                continue
            rest = self._data(stream_id, stream, payload)
            stream.held_bytes -= len(payload) - len(rest)
            if rest:
                held[0] = (kind, rest, flags)
                return
            held.popleft()
        self.events.drained(stream_id)

    # --- in ---------------------------------------------------------------------------
    def receive(self, data: bytes) -> None:
        """Raises ConnectionError_ once a GOAWAY is queued: send it, then close."""
        if self.closed:
            return
        buffer = self._buffer
        buffer += data
        if not self._preface:
            start = bytes(buffer[: len(PREFACE)])
            if not PREFACE.startswith(start):
                self._fail(PROTOCOL_ERROR, _not_a_preface(bytes(buffer)))
            if len(start) < len(PREFACE):
                return
            self._preface = True
            del buffer[: len(PREFACE)]
        pos, size = 0, len(buffer)
        try:
            while size - pos >= 9:
                length = (buffer[pos] << 16) | (buffer[pos + 1] << 8) | buffer[pos + 2]
                if length > DEFAULT_FRAME:  # the endpoint never raises SETTINGS_MAX_FRAME_SIZE
                    self._fail(FRAME_SIZE_ERROR, f"frame of {length} bytes")
                if size - pos - 9 < length:
                    break
                kind, flags = buffer[pos + 3], buffer[pos + 4]
                stream_id = _FRAME.unpack_from(buffer, pos + 5)[0] & 0x7FFFFFFF
                payload = bytes(buffer[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._on_frame(kind, flags, stream_id, payload)
                if self.closed:
                    break
        finally:
            del buffer[:pos]

    def _fail(self, code: int, message: str) -> NoReturn:
        self.goaway(code, message)
        raise ConnectionError_(code, message)

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != CONTINUATION:
            self._fail(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == HEADERS:
            if stream_id == 0:
                self._fail(PROTOCOL_ERROR, "HEADERS on stream 0")
            if flags & PADDED:
                payload = _unpad(payload, self)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._block = (stream_id, flags, [payload])
            if flags & END_HEADERS:
                self._header_block()
        elif kind == CONTINUATION:
            if self._block is None or self._block[0] != stream_id:
                self._fail(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
            fragments = self._block[2]
            fragments.append(payload)
            if sum(map(len, fragments)) > MAX_HEADER_BLOCK:
                self._fail(ENHANCE_YOUR_CALM, "header block too large")
            if flags & END_HEADERS:
                self._header_block()
        elif kind == SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8 or stream_id:
                self._fail(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "bad PING")
            if not flags & ACK:
                self._frame(PING, ACK, 0, payload)
        elif kind == RST_STREAM:
            if len(payload) != 4 or not stream_id:
                self._fail(
                    FRAME_SIZE_ERROR if len(payload) != 4 else PROTOCOL_ERROR, "bad RST_STREAM"
                )
            if self.streams.pop(stream_id, None) is not None:
                self.events.reset(stream_id, _FRAME.unpack(payload)[0])
        elif kind == GOAWAY:
            self.events.goaway()
        elif kind == PUSH_PROMISE:
            self._fail(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.1, §5.5)

    def _header_block(self) -> None:
        assert self._block is not None
        stream_id, flags, fragments = self._block
        self._block = None
        try:
            headers = self.headers.decode(b"".join(fragments))
        except HeaderError as exc:
            self._fail(COMPRESSION_ERROR, str(exc))
        ended = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client
            if not ended:
                self._stream_error(stream_id, PROTOCOL_ERROR)
                return
            stream.remote_open = False
            self.events.data(stream_id, b"", True)
            return
        if stream_id <= self.last_stream or not stream_id & 1:
            if stream_id & 1:  # a stream already closed: RFC 9113 §5.1
                self._frame(RST_STREAM, 0, stream_id, _FRAME.pack(STREAM_CLOSED))
                return
            self._fail(PROTOCOL_ERROR, f"stream {stream_id} cannot be opened by a client")
        self.last_stream = stream_id
        if _malformed(headers):  # RFC 9113 §8.1.1: a stream error, the connection goes on
            self._frame(RST_STREAM, 0, stream_id, _FRAME.pack(PROTOCOL_ERROR))
            return
        self.streams[stream_id] = _Stream(self._initial, remote_open=not ended)
        self.events.request(stream_id, headers, ended)

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            self._fail(PROTOCOL_ERROR, "DATA on stream 0")
        counted = len(payload)
        self._unacked += counted  # the connection's window counts every DATA frame
        if self._unacked >= RECEIVE_WINDOW // 2:
            self._frame(WINDOW_UPDATE, 0, 0, _FRAME.pack(self._unacked))
            self._unacked = 0
        if flags & PADDED:
            payload = _unpad(payload, self)
        stream = self.streams.get(stream_id)
        if stream is None or not stream.remote_open:
            if stream_id > self.last_stream:
                self._fail(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            if stream is not None:
                self._stream_error(stream_id, STREAM_CLOSED)
            return  # a stream the server already ended: what was in flight is dropped
        stream.unacked += counted
        ended = bool(flags & END_STREAM)
        if ended:
            stream.remote_open = False
        elif stream.unacked >= RECEIVE_WINDOW // 2:
            self._frame(WINDOW_UPDATE, 0, stream_id, _FRAME.pack(stream.unacked))
            stream.unacked = 0
        self.events.data(stream_id, payload, ended)

    def _stream_error(self, stream_id: int, code: int) -> None:
        if self.streams.pop(stream_id, None) is not None:
            self._frame(RST_STREAM, 0, stream_id, _FRAME.pack(code))
            self.events.reset(stream_id, code)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            self._fail(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            self._fail(FRAME_SIZE_ERROR, "SETTINGS of a length not a multiple of 6")
        for at in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, at)
            if key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    self._fail(FLOW_CONTROL_ERROR, "initial window too large")
                delta, self._initial = value - self._initial, value
                for stream in self.streams.values():
                    stream.window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 2**24 - 1:
                    self._fail(PROTOCOL_ERROR, f"max frame size {value}")
                self._frame_max = value
            elif key == S_ENABLE_PUSH and value > 1:
                self._fail(PROTOCOL_ERROR, f"enable push {value}")
        self._frame(SETTINGS, ACK, 0)
        self._release_all()

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            self._fail(FRAME_SIZE_ERROR, "WINDOW_UPDATE of a length other than 4")
        increment = _FRAME.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                self._fail(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._window += increment
            if self._window > MAX_WINDOW:
                self._fail(FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            self._release_all()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if increment == 0:
            self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        stream.window += increment
        if stream.window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR)
            return
        if stream.held:
            self._release(stream_id, stream)

    def _release_all(self) -> None:
        for stream_id, stream in list(self.streams.items()):
            if stream.held and self._window > 0:
                self._release(stream_id, stream)


_PSEUDO = frozenset((":method", ":scheme", ":authority", ":path"))
_CONNECTION_SPECIFIC = frozenset(
    ("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade")
)


def _malformed(headers: list[tuple[str, str]]) -> bool:
    """A request HTTP/2 forbids (RFC 9113 §8.2, §8.3): a field name empty or not in lower
    case, a pseudo-header unknown or after a regular field, a connection-specific field,
    no :method or :path."""
    regular = False
    seen = 0
    for name, value in headers:
        if not name or name != name.lower():
            return True
        if name[0] == ":":
            if regular or name not in _PSEUDO:
                return True
            seen += name in (":method", ":path")
        else:
            regular = True
            if name in _CONNECTION_SPECIFIC or (name == "te" and value != "trailers"):
                return True
    return seen != 2


def _not_a_preface(data: bytes) -> str:
    """What Netty's HTTP/2 server (RocketMQ's proxy) says to a client that is not one."""
    http1 = data[:1024].find(b"HTTP/1.")
    if http1 != -1:
        return "Unexpected HTTP/1.x request: " + data[:http1].decode("ascii", "replace")
    shown = data[: len(PREFACE)].hex()
    return "HTTP/2 client preface string missing or corrupt. Hex dump for received bytes: " + shown


def _unpad(payload: bytes, connection: ServerConnection) -> bytes:
    if not payload or payload[0] >= len(payload):
        connection._fail(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]
