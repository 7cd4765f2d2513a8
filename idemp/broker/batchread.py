"""A SEND_BATCH_MESSAGE body read as RocketMQ 4.9.7's broker reads it.

The broker never decodes a batch as a client would: CommitLog's MessageExtEncoder walks
the body with a ByteBuffer, skipping each entry's TOTALSIZE, MAGICCODE and BODYCRC, and
copies its body and properties into the stored records. So a wrong TOTALSIZE is no
error there, and a malformed body fails with whatever the buffer throws first, which is
what the producer reads (SYSTEM_ERROR, the exception's first frame; measured on 4.9.7
under JDK 17). ``idemp.remoting.message.iter_batch`` is the strict decoder for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from idemp.remoting.javaparse import JavaError

_UNDERFLOW = JavaError(
    "java.nio.BufferUnderflowException, java.base/java.nio.Buffer.nextGetIndex(Buffer.java:707)"
)
_OUT_OF_BOUNDS = JavaError(  # UtilAll.crc32 over a body past the buffer's end
    "java.lang.ArrayIndexOutOfBoundsException, java.base/java.util.zip.CRC32.update(CRC32.java:77)"
)
_POSITION_FRAME = "java.base/java.nio.Buffer.createPositionException(Buffer.java:341)"


class MalformedEntry(ValueError):
    """An entry RocketMQ would store unreadable (a negative properties length the walk
    survived): refused here as MESSAGE_ILLEGAL instead."""


@dataclass(frozen=True, slots=True)
class RawEntry:
    flag: int
    body: bytes
    properties: bytes  # as the producer wrote them, stored verbatim


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def get(self, size: int) -> int:
        if self.pos + size > len(self.data):
            raise _UNDERFLOW
        value = int.from_bytes(self.data[self.pos : self.pos + size], "big", signed=True)
        self.pos += size
        return value

    def position(self, new: int) -> None:
        if new > len(self.data):
            raise JavaError(
                "java.lang.IllegalArgumentException: newPosition > limit: "
                f"({new} > {len(self.data)}), {_POSITION_FRAME}"
            )
        if new < 0:
            raise JavaError(
                f"java.lang.IllegalArgumentException: newPosition < 0: ({new} < 0), "
                f"{_POSITION_FRAME}"
            )
        self.pos = new


def read_batch(data: bytes) -> list[RawEntry]:
    """The entries, or the JavaError RocketMQ's walk throws, or MalformedEntry."""
    cursor = _Cursor(data)
    entries: list[RawEntry] = []
    malformed = False
    while cursor.pos < len(data):
        cursor.get(4)  # TOTALSIZE, never checked
        cursor.get(4)  # MAGICCODE
        cursor.get(4)  # BODYCRC, computed again
        flag = cursor.get(4)
        body_len = cursor.get(4)
        body_pos = cursor.pos
        if body_len < 0 or body_pos + body_len > len(data):
            raise _OUT_OF_BOUNDS
        cursor.position(body_pos + body_len)
        props_len = cursor.get(2)
        props_pos = cursor.pos
        cursor.position(props_pos + props_len)
        if props_len < 0:
            malformed = True
            continue
        entries.append(
            RawEntry(
                flag, data[body_pos : body_pos + body_len], data[props_pos : props_pos + props_len]
            )
        )
    if malformed:
        raise MalformedEntry("a batch entry's properties length is negative")
    return entries
