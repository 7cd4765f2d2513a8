"""Length-prefixed frames: ``int32 length | int32 serType<<24|hdrLen | header | body``.

``FrameDecoder`` is fed whatever bytes arrive and returns whole commands; it checks a
frame's declared length before buffering it, so an absurd length costs nothing.
"""

from __future__ import annotations

import struct

from .codes import SerializeType
from .command import (
    ProtocolError,
    RemotingCommand,
    decode_binary_header,
    decode_json_header,
    encode_binary_header,
    encode_json_header,
)

DEFAULT_MAX_FRAME = 16 * 1024 * 1024  # Java: com.rocketmq.remoting.frameMaxLength
_PREFIX = struct.Struct(">ii")


class FrameTooLarge(ProtocolError):
    """The declared frame length exceeds the limit; refused before reading the frame."""


def encode(cmd: RemotingCommand) -> bytes:
    """One whole frame for ``cmd``, in the command's own serialization type."""
    if cmd.serialize_type == SerializeType.ROCKETMQ:
        header = encode_binary_header(cmd)
    else:
        header = encode_json_header(cmd)
    body = cmd.body
    return (
        _PREFIX.pack(4 + len(header) + len(body), (cmd.serialize_type << 24) | len(header))
        + header
        + body
    )


def decode_frame(frame: bytes | memoryview) -> RemotingCommand:
    """Decode one frame *without* its leading 4-byte length."""
    if len(frame) < 4:
        raise ProtocolError(f"frame of {len(frame)} bytes is shorter than its header length")
    (packed,) = struct.unpack_from(">i", frame, 0)
    ser_type = (packed >> 24) & 0xFF
    header_len = packed & 0xFFFFFF
    if header_len > len(frame) - 4:
        raise ProtocolError(f"header length {header_len} exceeds frame length {len(frame) - 4}")
    header = memoryview(frame)[4 : 4 + header_len]
    if ser_type == SerializeType.JSON:
        cmd = decode_json_header(header)
    elif ser_type == SerializeType.ROCKETMQ:
        cmd = decode_binary_header(header)
    else:
        raise ProtocolError(f"unknown serialization type {ser_type}")
    cmd.body = bytes(memoryview(frame)[4 + header_len :])
    return cmd


class FrameDecoder:
    """Incremental decoder: ``feed(bytes) -> [RemotingCommand, ...]``.

    After a ``ProtocolError`` the stream is out of sync and the connection should be
    closed; the decoder refuses further input.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self._broken = False

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[RemotingCommand]:
        if self._broken:
            raise ProtocolError("decoder is out of sync after an earlier error")
        buf = self._buf
        buf += data
        out: list[RemotingCommand] = []
        pos = 0
        n = len(buf)
        try:
            while n - pos >= 4:
                (length,) = struct.unpack_from(">i", buf, pos)
                if length < 4:
                    raise ProtocolError(f"invalid frame length {length}")
                if length > self._max:
                    raise FrameTooLarge(f"frame length {length} exceeds the limit {self._max}")
                if n - pos - 4 < length:
                    break
                out.append(decode_frame(memoryview(buf)[pos + 4 : pos + 4 + length]))
                pos += 4 + length
        except Exception:
            # Any failure leaves the stream out of sync, and its traceback may still pin a
            # memoryview of the buffer, which could then never be resized (BufferError).
            self._broken = True
            raise
        if pos:
            del buf[:pos]
        return out
