"""The commit log: one append-only file of stored message records.

Records use the wire layout of a pulled message, so a pull is a read of the log.
The physical offset of a record is its byte position, which makes it unique and
makes ``VIEW_MESSAGE_BY_ID``/send-back look-ups a single read.

Crash safety: at start the log is scanned; the first record that is incomplete, has
a bad magic code, a wrong physical offset or a body that fails its CRC ends the log,
and the file is cut there (a torn tail from a crash mid-write).
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

from idemp.remoting.message import MessageExt, MessageFormatError, body_crc, decode_message

log = logging.getLogger("idemp.broker.commitlog")

FILE_NAME = "00000000000000000000"


def scan(directory: Path) -> Iterator[MessageExt]:
    """Read a (possibly stopped, possibly torn) log without changing it."""
    path = directory / FILE_NAME
    if not path.exists():
        return
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if not size:
            return
        with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as view:
            pos = 0
            while pos + 4 <= size:
                rec_size = int.from_bytes(view[pos : pos + 4], "big", signed=True)
                if rec_size <= 0 or pos + rec_size > size:
                    return
                try:
                    msg, _ = decode_message(view[pos : pos + rec_size], 0, decompress=False)
                except MessageFormatError:
                    return
                if msg.commit_log_offset != pos or body_crc(msg.body) != msg.body_crc:
                    return
                yield msg
                pos += rec_size


class CommitLog:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / FILE_NAME
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.end = os.fstat(self._fd).st_size
        self.flushed = 0
        self.truncated_bytes = 0

    def recover(self) -> Iterator[MessageExt]:
        """Yield every whole record in order; cut a torn or corrupt tail."""
        size = os.fstat(self._fd).st_size
        pos = 0
        if size:
            with mmap.mmap(self._fd, size, access=mmap.ACCESS_READ) as view:
                while pos + 4 <= size:
                    rec_size = int.from_bytes(view[pos : pos + 4], "big", signed=True)
                    if rec_size <= 0 or pos + rec_size > size:
                        break
                    try:
                        msg, _ = decode_message(view[pos : pos + rec_size], 0, decompress=False)
                    except MessageFormatError as exc:
                        log.warning("commit log: record at %d is invalid (%s)", pos, exc)
                        break
                    if msg.commit_log_offset != pos or body_crc(msg.body) != msg.body_crc:
                        log.warning("commit log: record at %d fails its offset/CRC check", pos)
                        break
                    yield msg
                    pos += rec_size
        if pos < size:
            self.truncated_bytes = size - pos
            log.warning(
                "commit log: cut %d bytes of torn or corrupt tail at offset %d", size - pos, pos
            )
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
        self.end = pos
        self.flushed = pos

    def append(self, record: bytes) -> int:
        """Write one encoded record (its physical offset must be ``self.end``)."""
        start = self.end
        written = os.write(self._fd, record)
        if written != len(record):  # pragma: no cover - disk full mid-record
            os.ftruncate(self._fd, start)
            raise OSError(f"short write to commit log ({written} of {len(record)} bytes)")
        self.end = start + written
        return start

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def read_size_at(self, offset: int) -> int | None:
        if offset < 0 or offset + 4 > self.end:
            return None
        size = int.from_bytes(os.pread(self._fd, 4, offset), "big", signed=True)
        if size <= 0 or offset + size > self.end:
            return None
        return size

    def fsync(self) -> int:
        """Flush everything appended so far; return the offset that is now durable."""
        target = self.end
        os.fsync(self._fd)
        self.flushed = max(self.flushed, target)
        return target

    def close(self) -> None:
        os.close(self._fd)
