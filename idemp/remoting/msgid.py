"""Message ids: the broker's offsetMsgId and the client's UNIQ_KEY."""

from __future__ import annotations

import ipaddress
import os
import random
import struct
import threading
import time
from datetime import datetime, timezone

Host = tuple[str, int]


def offset_msg_id(store_host: Host, commit_log_offset: int) -> str:
    """Uppercase hex of store IP + port (int32) + commit-log offset (int64)."""
    addr = ipaddress.ip_address(store_host[0])
    return (addr.packed + struct.pack(">iq", store_host[1], commit_log_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """Inverse of :func:`offset_msg_id` (32 hex chars for IPv4, 56 for IPv6)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ValueError(f"offsetMsgId {msg_id!r} is not hex") from None
    if len(raw) == 16:
        ip_len = 4
    elif len(raw) == 28:
        ip_len = 16
    else:
        raise ValueError(f"offsetMsgId {msg_id!r} has {len(msg_id)} hex chars, not 32 or 56")
    ip = str(ipaddress.ip_address(raw[:ip_len]))
    port, offset = struct.unpack(">iq", raw[ip_len:])
    return (ip, port), offset


class UniqKeyGenerator:
    """Client message ids shaped like the official clients' UNIQ_KEY.

    ip (4 or 16 bytes) | pid (2) | random (4) | ms since start of month (4) | counter (2).
    Unique per process: the counter plus the time part; the random part separates
    processes that share an ip and a (recycled) pid.
    """

    def __init__(self, ip: str = "127.0.0.1", pid: int | None = None) -> None:
        addr = ipaddress.ip_address(ip)
        pid = os.getpid() if pid is None else pid
        self._prefix = (
            (
                addr.packed
                + struct.pack(">H", pid & 0xFFFF)
                + struct.pack(">I", random.getrandbits(32))
            )
            .hex()
            .upper()
        )
        self._lock = threading.Lock()
        self._counter = 0
        self._month_start_ms = 0
        self._next_month_ms = 0

    def _month_bounds(self, now_ms: int) -> None:
        now = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc).astimezone()
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else start.replace(month=start.month + 1)
        )
        self._month_start_ms = int(start.timestamp() * 1000)
        self._next_month_ms = int(nxt.timestamp() * 1000)

    def next_id(self) -> str:
        now_ms = int(time.time() * 1000)
        with self._lock:
            if now_ms >= self._next_month_ms:
                self._month_bounds(now_ms)
            self._counter = (self._counter + 1) & 0xFFFF
            counter = self._counter
            delta = (now_ms - self._month_start_ms) & 0xFFFFFFFF
        return self._prefix + struct.pack(">IH", delta, counter).hex().upper()
