"""RemotingCommand <-> frame bytes: round trips, incremental decoding, hostile input."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idemp.remoting import (
    DEFAULT_MAX_FRAME,
    FrameDecoder,
    FrameTooLarge,
    HeaderFieldError,
    ProtocolError,
    RemotingCommand,
    SerializeType,
    decode_frame,
    encode,
    framing,
)
from idemp.remoting.command import encode_binary_header

from .strategies import chunked, commands, expected_after_wire


def frame(header: bytes, body: bytes = b"", ser: int = 0) -> bytes:
    prefix = struct.pack(">iI", 4 + len(header) + len(body), (ser << 24) | len(header))
    return prefix + header + body


def feed_all(dec: FrameDecoder, chunks: list[bytes]) -> list[RemotingCommand]:
    out: list[RemotingCommand] = []
    for c in chunks:
        out += dec.feed(c)
    return out


# --- round trips -----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_commands_round_trip_through_chunked_stream(data: st.DataObject) -> None:
    cmds = data.draw(st.lists(commands(), min_size=1, max_size=5))
    stream = b"".join(encode(c) for c in cmds)
    dec = FrameDecoder()
    got = feed_all(dec, data.draw(chunked(stream)))
    assert got == [expected_after_wire(c) for c in cmds]
    assert dec.buffered == 0


@pytest.mark.parametrize("ser", list(SerializeType))
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_commands_round_trip_byte_at_a_time(ser: int, data: st.DataObject) -> None:
    cmd = data.draw(commands(serialize_type=ser))
    wire = encode(cmd)
    dec = FrameDecoder()
    got: list[RemotingCommand] = []
    for i in range(len(wire)):
        got += dec.feed(wire[i : i + 1])
        assert len(got) == (1 if i == len(wire) - 1 else 0)
    assert got == [expected_after_wire(cmd)]


@settings(max_examples=100, deadline=None)
@given(commands())
def test_encode_layout(cmd: RemotingCommand) -> None:
    wire = encode(cmd)
    length, packed = struct.unpack_from(">ii", wire)
    assert length == len(wire) - 4
    assert packed >> 24 == cmd.serialize_type
    header_len = packed & 0xFFFFFF
    assert wire[8 + header_len :] == cmd.body
    assert decode_frame(wire[4:]) == expected_after_wire(cmd)
    if cmd.serialize_type == SerializeType.JSON:
        header = json.loads(wire[8 : 8 + header_len])
        assert header["extFields"] == cmd.ext_fields
        assert (header["code"], header["opaque"], header["flag"]) == (
            cmd.code,
            cmd.opaque,
            cmd.flag,
        )


def test_json_header_exact_and_lenient_input() -> None:
    cmd = RemotingCommand(
        code=10, opaque=7, flag=1, language="JAVA", version=407, ext_fields={"a": "1"}
    )
    assert encode(cmd)[8:] == (
        b'{"code":10,"extFields":{"a":"1"},"flag":1,"language":"JAVA","opaque":7,'
        b'"serializeTypeCurrentRPC":"JSON","version":407}'
    )
    # C++ style: numbers and booleans in extFields, trailing newline, numeric language
    (got,) = FrameDecoder().feed(
        frame(
            b'{"code":"11","extFields":{"queueId":3,"big":12345678901234,"b":true,"n":null},'
            b'"flag":0,"language":1,"opaque":5,"remark":"","version":63}\n'
        )
    )
    assert got == RemotingCommand(
        code=11,
        opaque=5,
        flag=0,
        language="CPP",
        version=63,
        remark="",
        ext_fields={"queueId": "3", "big": "12345678901234", "b": "true"},
    )


def test_response_and_field_helpers() -> None:
    req = RemotingCommand(
        code=11,
        opaque=42,
        flag=2,
        serialize_type=SerializeType.ROCKETMQ,
        ext_fields={"n": "17", "t": "true", "one": "1", "zero": "0", "e": ""},
    )
    resp = req.response(19, remark="no", ext_fields={"x": "y"})
    assert (resp.code, resp.opaque, resp.flag, resp.serialize_type) == (19, 42, 1, 1)
    assert resp.is_response and not resp.is_oneway and req.is_oneway
    assert (resp.remark, resp.ext_fields, resp.body) == ("no", {"x": "y"}, b"")
    assert req.field_int("n") == 17 and req.field_int("missing", 5) == 5
    assert req.field_int("e", 9) == 9
    assert [req.field_bool(k) for k in ("t", "one", "zero", "missing")] == [
        True,
        True,
        False,
        False,
    ]
    with pytest.raises(HeaderFieldError, match="<missing> is null"):
        req.field_int("missing")
    with pytest.raises(HeaderFieldError, match="not an integer"):
        req.field_int("t")
    with pytest.raises(HeaderFieldError):
        req.require("n", "missing")


def test_many_frames_then_more_data_no_buffer_error() -> None:
    """``del buf[:pos]`` must not meet a live memoryview export of the buffer."""
    cmds = [
        RemotingCommand(code=i % 400, opaque=i, ext_fields={"i": str(i)}, body=bytes(i % 50))
        for i in range(2000)
    ]
    wires = [encode(c) for c in cmds]
    dec = FrameDecoder()
    first = b"".join(wires[:1000]) + wires[1000][:7]
    got = dec.feed(first)
    assert len(got) == 1000 and dec.buffered == 7
    assert all(type(c.body) is bytes for c in got)  # no views into the decoder's buffer
    got += dec.feed(wires[1000][7:] + b"".join(wires[1001:1500]))
    got += dec.feed(b"".join(wires[1500:]))
    assert got == cmds and dec.buffered == 0
    assert dec.feed(b"") == []


# --- hostile input ---------------------------------------------------------------------


def test_oversize_length_refused_on_its_four_bytes() -> None:
    dec = FrameDecoder()
    prefix = struct.pack(">i", DEFAULT_MAX_FRAME + 1)
    for b in prefix[:3]:
        assert dec.feed(bytes([b])) == []
    with pytest.raises(FrameTooLarge):
        dec.feed(prefix[3:])
    assert dec.buffered == 4
    with pytest.raises(ProtocolError):  # out of sync: refuses, buffers nothing more
        dec.feed(b"\x00" * 100_000)
    assert dec.buffered == 4


def test_oversize_refused_before_body_arrives_with_custom_limit() -> None:
    dec = FrameDecoder(max_frame=1024)
    with pytest.raises(FrameTooLarge):
        dec.feed(struct.pack(">ii", 1025, 10) + b"x" * 50)
    assert dec.buffered == 58


def test_limit_is_inclusive() -> None:
    header = b'{"code":1}'
    body = b"b" * (64 - 4 - len(header))
    (cmd,) = FrameDecoder(max_frame=64).feed(frame(header, body))
    assert cmd.body == body
    with pytest.raises(FrameTooLarge):
        FrameDecoder(max_frame=63).feed(frame(header, body))


def test_large_but_legal_length_waits_for_data() -> None:
    dec = FrameDecoder()
    assert dec.feed(struct.pack(">ii", 10_000_000, 10)) == []
    assert dec.buffered == 8


@pytest.mark.parametrize("length", [-1, -(2**31), 0, 1, 2, 3])
def test_negative_or_short_lengths(length: int) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError) as exc:
        dec.feed(struct.pack(">i", length))
    assert type(exc.value) is ProtocolError


BAD_FRAMES = {
    "header longer than frame": struct.pack(">ii", 4 + 3, 10) + b"abc",
    "header len 0xFFFFFF": struct.pack(">ii", 4 + 3, 0xFFFFFF) + b"abc",
    "invalid json": frame(b"{not json"),
    "empty json header": frame(b""),
    "json array": frame(b"[1,2]"),
    "json number": frame(b"1"),
    "json string": frame(b'"s"'),
    "json null": frame(b"null"),
    "code not int": frame(b'{"code":"abc"}'),
    "code beyond 32 bits": frame(b'{"code":99999999999}'),
    "code list": frame(b'{"code":[1]}'),
    "language no LanguageCode": frame(b'{"code":1,"language":13}'),
    "language negative": frame(b'{"code":1,"language":-1}'),
    "opaque not int": frame(b'{"code":1,"opaque":{}}'),
    "language list": frame(b'{"code":1,"language":[]}'),
    "extFields list": frame(b'{"code":1,"extFields":["a"]}'),
    "deeply nested json": frame(b"[" * 100_000),
    "deeply nested extFields": frame(b'{"code":1,"extFields":{"a":' + b"[" * 50_000 + b"}}"),
    "serialize type 2": frame(b'{"code":1}', ser=2),
    "serialize type 255": frame(b'{"code":1}', ser=255),
    "binary header empty": frame(b"", ser=1),
    "binary remark negative": frame(struct.pack(">hbhiii", 1, 0, 0, 0, 0, -1), ser=1),
    "binary remark too long": frame(struct.pack(">hbhiii", 1, 0, 0, 0, 0, 5) + b"ab", ser=1),
    "binary remark not utf-8": frame(
        struct.pack(">hbhiii", 1, 0, 0, 0, 0, 1) + b"\xff" + struct.pack(">i", 0), ser=1
    ),
    "binary ext negative": frame(struct.pack(">hbhiiii", 1, 0, 0, 0, 0, 0, -4), ser=1),
    "binary ext too long": frame(struct.pack(">hbhiiii", 1, 0, 0, 0, 0, 0, 40), ser=1),
    "binary key negative": frame(struct.pack(">hbhiiiih", 1, 0, 0, 0, 0, 0, 2, -1), ser=1),
    "binary key past ext": frame(struct.pack(">hbhiiiih", 1, 0, 0, 0, 0, 0, 3, 5) + b"k", ser=1),
    "binary value truncated": frame(
        struct.pack(">hbhiiiih", 1, 0, 0, 0, 0, 0, 5, 1) + b"k" + b"\x00\x00", ser=1
    ),
    "binary value past ext": frame(
        struct.pack(">hbhiiiih", 1, 0, 0, 0, 0, 0, 7, 1) + b"k" + struct.pack(">i", 9), ser=1
    ),
    "binary key not utf-8": frame(
        struct.pack(">hbhiiiih", 1, 0, 0, 0, 0, 0, 7, 1) + b"\xff" + struct.pack(">i", 0), ser=1
    ),
}


@pytest.mark.parametrize(
    "header, expected",
    [
        # each answered by RocketMQ 4.9.7 as fastjson reads it (seen with a raw client)
        (b'{"opaque":1}', (0, 1, "JAVA", None)),  # no code: "request type 0 not supported"
        (b'{"code":true,"opaque":1}', (1, 1, "JAVA", None)),
        (b'{"code":26.0,"opaque":1.9}', (26, 1, "JAVA", None)),
        (b'{"code":"26","opaque":"7","language":null}', (26, 7, "JAVA", None)),
        (b'{"code":26,"language":12}', (26, 0, "RUST", None)),
        (b'{"code":26,"language":"FOO"}', (26, 0, "FOO", None)),
        (b'{"code":26,"remark":"\xff\xfe"}', (26, 0, "JAVA", "\ufffd\ufffd")),
    ],
)
def test_lenient_json_headers_read_as_fastjson_reads_them(
    header: bytes, expected: tuple[int, int, str, str | None]
) -> None:
    (cmd,) = FrameDecoder().feed(frame(header))
    assert (cmd.code, cmd.opaque, cmd.language, cmd.remark) == expected


@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_bad_frames_raise_protocol_error(name: str) -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError) as exc:
        dec.feed(BAD_FRAMES[name])
    assert not isinstance(exc.value, FrameTooLarge)
    # The exception (and its traceback) is still alive here; the decoder must refuse
    # further input cleanly rather than hit BufferError on its pinned buffer.
    with pytest.raises(ProtocolError, match="out of sync"):
        dec.feed(b"more")


def test_truncated_binary_headers() -> None:
    cmd = RemotingCommand(
        code=310,
        opaque=9,
        flag=0,
        language="PYTHON",
        version=409,
        remark="r\u00e9m",
        ext_fields={"topic": "T", "k\u00e9y": "v" * 5},
        serialize_type=SerializeType.ROCKETMQ,
    )
    header = encode_binary_header(cmd)
    (full,) = FrameDecoder().feed(frame(header, b"BODY", ser=1))
    assert full == RemotingCommand(
        code=310,
        opaque=9,
        flag=0,
        language="PYTHON",
        version=409,
        remark="r\u00e9m",
        ext_fields={"topic": "T", "k\u00e9y": "vvvvv"},
        body=b"BODY",
        serialize_type=SerializeType.ROCKETMQ,
    )
    for cut in range(len(header)):
        with pytest.raises(ProtocolError):
            decode_frame(frame(header[:cut], ser=1)[4:])


def test_decode_frame_shorter_than_its_header_length_field() -> None:
    for short in (b"", b"\x00", b"\x00\x00\x00"):
        with pytest.raises(ProtocolError):
            decode_frame(short)


def test_unexpected_exception_also_breaks_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a codec bug must not leave the buffer pinned and the decoder feedable."""

    def boom(view: memoryview) -> RemotingCommand:
        raise RuntimeError("bug")

    monkeypatch.setattr(framing, "decode_frame", boom)
    dec = FrameDecoder()
    with pytest.raises(RuntimeError):
        dec.feed(frame(b'{"code":1}'))
    with pytest.raises(ProtocolError, match="out of sync"):
        dec.feed(b"x")


# --- fuzz --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzz_frame_decoder_raises_only_protocol_errors(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["random", "framed", "mutated"]))
    if kind == "random":
        stream = data.draw(st.binary(max_size=300))
    elif kind == "framed":
        ser = data.draw(st.sampled_from([0, 1, 0, 1, 2, 255]))
        header = data.draw(st.binary(max_size=120) | st.text(max_size=60).map(str.encode))
        stream = frame(header, data.draw(st.binary(max_size=20)), ser=ser)
    else:
        mutable = bytearray(encode(data.draw(commands())))
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(4, len(mutable) - 1))
            mutable[i] = data.draw(st.integers(0, 255))
        stream = bytes(mutable)
    dec = FrameDecoder(max_frame=data.draw(st.sampled_from([64, 4096, DEFAULT_MAX_FRAME])))
    try:
        for chunk in data.draw(chunked(stream)):
            for cmd in dec.feed(chunk):
                assert isinstance(cmd, RemotingCommand)
                assert all(type(k) is str and type(v) is str for k, v in cmd.ext_fields.items())
    except ProtocolError:
        with pytest.raises(ProtocolError):
            dec.feed(b"")
