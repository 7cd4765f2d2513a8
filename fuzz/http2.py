"""Fuzz target for the broker's RocketMQ 5 endpoint below the service: the bytes a client
sends on a connection, through idemp's HTTP/2, HPACK and gRPC framing to the service.

Input: the first byte picks where the bytes are cut in two reads (and 0xFF leaves out the
connection preface, so the preface check is fuzzed too); the rest is what the client sends.
Seeds are whole calls of every RPC as a grpc client frames them (``seed_streams``).
Contract: nothing escapes ``data_received``; the broker logs no ERROR; asyncio's exception
handler is never reached; what the server writes is whole, well-formed HTTP/2 frames; and
once the connection is lost, none of its calls is left running.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

PATH = "/apache.rocketmq.v2.MessagingService/"


def _frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    head = struct.pack(">I", len(payload))[1:] + bytes((kind, flags))
    return head + struct.pack(">I", stream_id) + payload


def seed_streams() -> list[bytes]:
    """One connection per seed request of the grpc5 target: SETTINGS, then the call."""
    import hpack

    from fuzz.grpc5 import methods, seed_requests
    from idemp.broker.v5 import http2

    names = [m[0] for m in methods()]
    seeds = []
    for n, seed in enumerate(seed_requests()):
        name, message = names[seed[0]], seed[1:]
        block = hpack.Encoder().encode(
            [
                (":path", PATH + name),
                (":method", "POST"),
                (":scheme", "http"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", "3S"),
                ("x-mq-client-id", "fuzz-client"),
                ("x-mq-request-id", f"request-{n}"),
            ],
            huffman=bool(n % 2),
        )
        framed = b"\x00" + len(message).to_bytes(4, "big") + message
        ended = 0 if name == "Telemetry" else http2.END_STREAM
        wire = (
            _frame(http2.SETTINGS, 0, 0, struct.pack(">HI", http2.S_INITIAL_WINDOW_SIZE, 1 << 16))
            + _frame(http2.HEADERS, http2.END_HEADERS, 1, block)
            + _frame(http2.DATA, ended, 1, framed)
        )
        if n % 3 == 0:
            wire += _frame(http2.PING, 0, 0, b"12345678")
            wire += _frame(http2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 1000))
        if n % 5 == 0:
            wire += _frame(http2.RST_STREAM, 0, 1, struct.pack(">I", http2.CANCEL))
        seeds.append(bytes([n % 250]) + wire)
    return seeds


def _check_frames(data: bytes) -> None:
    at = 0
    while at < len(data):
        assert len(data) - at >= 9, f"a partial frame header at {at}"
        length = int.from_bytes(data[at : at + 3], "big")
        assert data[at + 3] <= 0x9, f"frame type {data[at + 3]}"
        assert len(data) - at - 9 >= length, f"a frame of {length} bytes cut short"
        at += 9 + length


def http2(data: bytes) -> None:
    from fuzz.grpc5 import shared_harness
    from fuzz.targets import _FakeTransport
    from idemp.broker.v5 import endpoint
    from idemp.broker.v5.http2 import PREFACE

    if not data:
        return
    harness = shared_harness()
    grpc = harness.server.grpc
    wire = data[1:] if data[0] == 0xFF else PREFACE + data[1:]
    cut = data[0] % (len(wire) + 1)
    transport = _FakeTransport()

    async def feed() -> list[asyncio.Task[Any]]:
        conn = endpoint._Connection(grpc)
        conn.connection_made(transport)
        try:
            conn.data_received(wire[:cut])
            conn.data_received(wire[cut:])
            for _ in range(4):  # calls start, answer, the flush follows
                await asyncio.sleep(0)
        finally:
            tasks = [s.task for s in conn.calls.values() if s.task is not None]
            conn.connection_lost(None)
            if tasks:  # cancelled: they end without the client (a long poll takes turns)
                await asyncio.wait(tasks, timeout=5)
        return tasks

    tasks = harness.loop.run_until_complete(feed())
    harness.raise_errors("http2")
    assert all(t.done() for t in tasks), "a call still runs 5 s after its connection was lost"
    _check_frames(bytes(transport.out))
