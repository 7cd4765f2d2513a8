"""The endpoint's HTTP/2 and HPACK, sans-IO: header blocks from the ``hpack`` library's
encoder (a real peer's), frames built by hand for what no client sends on purpose."""

from __future__ import annotations

import struct
from typing import Any

import hpack
import pytest

from idemp.broker.v5 import http2
from idemp.broker.v5.headerblock import RESPONSE_HEADERS, HeaderDecoder, HeaderError, encode

REQUEST = [
    (":path", "/apache.rocketmq.v2.MessagingService/SendMessage"),
    (":authority", "127.0.0.1:8081"),
    (":method", "POST"),
    (":scheme", "http"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("grpc-timeout", "3010m"),
    ("x-mq-client-id", "vm@1@0@abc"),
    ("x-mq-request-id", "e1b48f40-7058-464a-81fc-ac3546cb5eff"),
    ("x-mq-namespace", ""),
]


def _pairs(headers: Any) -> list[tuple[str, str]]:
    """hpack's decoded headers (its HeaderTuple) as plain pairs."""
    return [(str(k), str(v)) for k, v in headers]


@pytest.mark.parametrize("huffman", [False, True])
def test_blocks_of_a_real_encoder_decode_as_its_own_decoder_reads_them(huffman: bool) -> None:
    encoder, theirs, ours = hpack.Encoder(), hpack.Decoder(), HeaderDecoder()
    for n in range(40):  # enough to fill the 4 KiB table and evict from it
        headers: list[tuple[str, str]] = [
            *REQUEST,
            ("x-mq-request-id", f"id-{n}" * 9),
            (f"x-extra-{n % 7}", "v" * n),
        ]
        if n % 5 == 0:
            headers.append(hpack.NeverIndexedHeaderTuple("authorization", f"secret-{n}"))  # type: ignore[arg-type]
        block = encoder.encode(headers, huffman=huffman)
        expected = _pairs(theirs.decode(block))
        assert ours.decode(block) == expected
    assert ours.size == theirs.header_table._current_size
    assert len(ours.table) == len(theirs.header_table.dynamic_entries)


def test_a_table_size_update_evicts_as_the_encoder_expects() -> None:
    encoder, ours = hpack.Encoder(), HeaderDecoder()
    ours.decode(encoder.encode(REQUEST))
    assert len(ours.table) == 8  # all but ":method: POST" and ":scheme: http", static
    encoder.header_table_size = 100  # the block begins with a size update
    block = encoder.encode([("x-a", "1")])
    assert ours.decode(block) == [("x-a", "1")]
    # what fits in 100 octets: the new entry (36) and the newest before it (46)
    assert [(name, size) for name, _, size in ours.table] == [("x-a", 36), ("x-mq-namespace", 46)]
    assert (ours.max_size, ours.size) == (100, 82)


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        (b"\xbe", "header index 62 is not in the table"),
        (b"\x80", "header index 0 is not in the table"),
        (b"\x00\x05ab", "header string runs past the block"),
        (b"\x3f\xe1\x1f", "table size 4096 over the limit"),  # 31 + 4065
        (b"\x00", "header block truncated"),
        (b"\x7f\xff\xff\xff\xff\xff\x01", "header integer too large"),
    ],
)
def test_a_bad_block_is_a_header_error(block: bytes, problem: str) -> None:
    decoder = HeaderDecoder(max_size=4095)
    with pytest.raises(HeaderError, match=problem):
        decoder.decode(block)


def test_the_response_blocks_read_back() -> None:
    decoder = hpack.Decoder()
    assert _pairs(decoder.decode(RESPONSE_HEADERS)) == [
        (":status", "200"),
        ("content-type", "application/grpc"),
    ]
    long = "é" * 200  # a length over the 7-bit prefix, and UTF-8
    assert _pairs(decoder.decode(encode([("grpc-message", long)]))) == [("grpc-message", long)]
    assert decoder.header_table.dynamic_entries == type(decoder.header_table.dynamic_entries)()


# --- frames ------------------------------------------------------------------------------


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes((kind, flags))
        + struct.pack(">I", stream)
        + payload
    )


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    while data:
        length = int.from_bytes(data[:3], "big")
        kind, flags = data[3], data[4]
        stream = struct.unpack(">I", data[5:9])[0]
        out.append((kind, flags, stream, data[9 : 9 + length]))
        data = data[9 + length :]
    return out


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def request(self, stream_id: int, headers: list[tuple[str, str]], ended: bool) -> None:
        self.seen.append(("request", stream_id, dict(headers)[":path"], ended))

    def data(self, stream_id: int, data: bytes, ended: bool) -> None:
        self.seen.append(("data", stream_id, data, ended))

    def reset(self, stream_id: int, code: int) -> None:
        self.seen.append(("reset", stream_id, code))

    def drained(self, stream_id: int) -> None:
        self.seen.append(("drained", stream_id))

    def goaway(self) -> None:
        self.seen.append(("goaway",))


def opened(settings: dict[int, int] | None = None) -> tuple[http2.ServerConnection, Recorder]:
    events = Recorder()
    conn = http2.ServerConnection(events)
    greeting = frames(conn.data_to_send())
    assert greeting == [
        (http2.SETTINGS, 0, 0, struct.pack(">HIHI", 4, 1 << 20, 6, 1 << 20)),
        (http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 20) - 65535)),
    ]
    payload = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
    conn.receive(http2.PREFACE + frame(http2.SETTINGS, 0, 0, payload))
    assert frames(conn.data_to_send()) == [(http2.SETTINGS, http2.ACK, 0, b"")]
    return conn, events


HEADERS_1 = hpack.Encoder().encode(REQUEST)


def test_a_request_in_frames_cut_anywhere() -> None:
    conn, events = opened()
    wire = (
        frame(http2.HEADERS, 0, 1, HEADERS_1[:20])
        + frame(http2.CONTINUATION, http2.END_HEADERS, 1, HEADERS_1[20:])
        + frame(http2.DATA, http2.PADDED, 1, b"\x03" + b"hello" + b"\x00" * 3)
        + frame(http2.DATA, http2.END_STREAM, 1, b" world")
        + frame(http2.PING, 0, 0, b"12345678")
    )
    for at in range(0, len(wire), 7):  # the bytes arrive in small pieces
        conn.receive(wire[at : at + 7])
    path = "/apache.rocketmq.v2.MessagingService/SendMessage"
    assert events.seen == [
        ("request", 1, path, False),
        ("data", 1, b"hello", False),
        ("data", 1, b" world", True),
    ]
    assert frames(conn.data_to_send()) == [(http2.PING, http2.ACK, 0, b"12345678")]


def test_what_the_windows_hold_back_leaves_in_order_when_they_open() -> None:
    conn, events = opened({http2.S_INITIAL_WINDOW_SIZE: 10})  # SETTINGS_INITIAL_WINDOW_SIZE = 10
    conn.receive(frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, HEADERS_1))
    conn.send_headers(1, RESPONSE_HEADERS)
    assert conn.send_data(1, b"0123456789abcdef") == 6  # six bytes wait for window
    assert conn.send_data(1, b"XY") == 8
    conn.send_headers(1, encode([("grpc-status", "0")]), end=True)  # after the held data
    sent = frames(conn.data_to_send())
    assert [(k, p) for k, _, _, p in sent] == [
        (http2.HEADERS, RESPONSE_HEADERS),
        (0, b"0123456789"),
    ]
    conn.receive(frame(http2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 5)))
    assert [(k, p) for k, _, _, p in frames(conn.data_to_send())] == [(0, b"abcde")]
    # the peer raises the initial window: every stream's window grows by the difference
    conn.receive(frame(http2.SETTINGS, 0, 0, struct.pack(">HI", 4, 100)))
    sent = frames(conn.data_to_send())
    assert [(k, f, p) for k, f, _, p in sent] == [
        (http2.SETTINGS, http2.ACK, b""),
        (0, 0, b"f"),
        (0, 0, b"XY"),
        (http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, encode([("grpc-status", "0")])),
    ]
    assert conn.streams == {}  # the trailers ended it
    assert [e for e in events.seen if e[0] == "drained"] == []  # nobody writes any more


def test_the_connection_window_holds_every_stream_back() -> None:
    conn, events = opened()
    conn._window = 4  # as if the peer had taken all but 4 bytes of it
    for stream in (1, 3):
        conn.receive(frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, stream, HEADERS_1))
    assert conn.send_data(1, b"aaaaaa") == 2
    assert conn.send_data(3, b"bb") == 2
    assert [p for _, _, _, p in frames(conn.data_to_send())] == [b"aaaa"]
    conn.receive(frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 100)))
    assert sorted(p for _, _, _, p in frames(conn.data_to_send())) == [b"aa", b"bb"]
    assert sorted(e for e in events.seen if e[0] == "drained") == [("drained", 1), ("drained", 3)]


def test_a_long_message_is_cut_at_the_peers_frame_size() -> None:
    conn, _ = opened()
    conn.receive(frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, HEADERS_1))
    conn.receive(frame(http2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 100_000)))
    conn.receive(frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 100_000)))
    conn.send_data(1, b"z" * 40_000)
    assert [len(p) for _, _, _, p in frames(conn.data_to_send())] == [16_384, 16_384, 7_232]


def test_received_data_is_given_back_by_window_updates() -> None:
    conn, events = opened()
    conn.receive(frame(http2.HEADERS, http2.END_HEADERS, 1, HEADERS_1))
    chunk = b"d" * 16_384
    for _ in range(32):  # half a MiB: the receive window's half
        conn.receive(frame(http2.DATA, 0, 1, chunk))
    updates = [(s, p) for k, _, s, p in frames(conn.data_to_send()) if k == http2.WINDOW_UPDATE]
    assert updates == [(0, struct.pack(">I", 1 << 19)), (1, struct.pack(">I", 1 << 19))]
    assert sum(len(e[2]) for e in events.seen if e[0] == "data") == 1 << 19


def test_a_reset_reaches_the_call_and_later_frames_of_the_stream_are_dropped() -> None:
    conn, events = opened()
    conn.receive(frame(http2.HEADERS, http2.END_HEADERS, 1, HEADERS_1))
    conn.receive(frame(http2.RST_STREAM, 0, 1, struct.pack(">I", http2.CANCEL)))
    conn.receive(frame(http2.DATA, 0, 1, b"late"))
    assert events.seen[1:] == [("reset", 1, http2.CANCEL)]
    conn.send_data(1, b"to nobody")
    assert [k for k, _, _, _ in frames(conn.data_to_send())] == []


@pytest.mark.parametrize(
    ("wire", "code", "reason"),
    [
        (
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            http2.PROTOCOL_ERROR,
            "Unexpected HTTP/1.x request: GET / ",  # Netty's words, as RocketMQ's proxy
        ),
        (
            bytes(range(1, 30)),  # as RocketMQ 5.3.3's proxy answers it, the first 24 shown
            http2.PROTOCOL_ERROR,
            "HTTP/2 client preface string missing or corrupt. Hex dump for received bytes: "
            + bytes(range(1, 25)).hex(),
        ),
        (frame(http2.DATA, 0, 0, b"x"), http2.PROTOCOL_ERROR, "DATA on stream 0"),
        (frame(http2.DATA, 0, 7, b"x"), http2.PROTOCOL_ERROR, "DATA on idle stream 7"),
        (
            frame(http2.HEADERS, http2.END_HEADERS, 2, HEADERS_1),
            http2.PROTOCOL_ERROR,
            "stream 2 cannot be opened by a client",
        ),
        (
            frame(http2.HEADERS, http2.END_HEADERS, 1, b"\xbe"),
            http2.COMPRESSION_ERROR,
            "header index 62",
        ),
        (
            frame(http2.HEADERS, 0, 1, b"") + frame(http2.PING, 0, 0, b"x" * 8),
            http2.PROTOCOL_ERROR,
            "a header block was interrupted",
        ),
        (frame(http2.PING, 0, 0, b"x"), http2.FRAME_SIZE_ERROR, "bad PING"),
        (frame(http2.SETTINGS, 0, 0, b"x"), http2.FRAME_SIZE_ERROR, "SETTINGS of a length"),
        (
            frame(http2.SETTINGS, 0, 0, struct.pack(">HI", 5, 100)),
            http2.PROTOCOL_ERROR,
            "max frame size 100",
        ),
        (
            frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)),
            http2.PROTOCOL_ERROR,
            "WINDOW_UPDATE of 0",
        ),
        (
            frame(http2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1)),
            http2.FLOW_CONTROL_ERROR,
            "connection window over",
        ),
        (
            frame(http2.PUSH_PROMISE, 0, 1, b"\x00" * 4),
            http2.PROTOCOL_ERROR,
            "a client may not push",
        ),
        (
            struct.pack(">I", 16_385)[1:] + b"\x00" * 6,
            http2.FRAME_SIZE_ERROR,
            "frame of 16385 bytes",
        ),
    ],
)
def test_a_broken_rule_ends_the_connection_with_a_goaway(
    wire: bytes, code: int, reason: str
) -> None:
    conn, _ = opened()
    if wire.startswith((b"GET", b"\x01")):  # instead of the preface
        conn = http2.ServerConnection(Recorder())
        conn.data_to_send()
    with pytest.raises(http2.ConnectionError_, match=reason) as ended:
        conn.receive(wire)
    assert ended.value.code == code
    kind, _, _, payload = frames(conn.data_to_send())[-1]
    assert kind == http2.GOAWAY
    assert struct.unpack(">II", payload[:8]) == (0, code) and reason.encode() in payload
    conn.receive(frame(http2.PING, 0, 0, b"x" * 8))  # nothing more is read or answered
    assert conn.data_to_send() == b""


@pytest.mark.parametrize(
    "headers",
    [
        [("", "x"), (":method", "POST"), (":path", "/p")],  # the fuzzer's first find
        [(":method", "POST"), (":path", "/p"), ("X-Upper", "1")],
        [(":method", "POST"), ("a", "1"), (":path", "/p")],
        [(":method", "POST"), (":path", "/p"), (":status", "200")],
        [(":method", "POST"), (":path", "/p"), ("connection", "close")],
        [(":method", "POST"), (":path", "/p"), ("te", "gzip")],
        [(":method", "POST")],
    ],
)
def test_a_malformed_request_resets_its_stream_and_the_connection_goes_on(
    headers: list[tuple[str, str]],
) -> None:
    conn, events = opened()
    encoder = hpack.Encoder()
    block = encoder.encode(headers)
    conn.receive(frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, block))
    assert frames(conn.data_to_send()) == [
        (http2.RST_STREAM, 0, 1, struct.pack(">I", http2.PROTOCOL_ERROR))
    ]
    assert events.seen == []
    good = encoder.encode(REQUEST)  # the header table still agrees with the encoder's
    conn.receive(frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 3, good))
    assert events.seen == [("request", 3, REQUEST[0][1], True)]
