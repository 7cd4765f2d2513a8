"""Stored message records, property strings and batch bodies."""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
import zlib
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idemp.remoting import (
    BatchEntry,
    MessageExt,
    MessageFormatError,
    MessageSysFlag,
    decode_batch,
    decode_message,
    decode_messages,
    decode_properties,
    encode_batch,
    encode_message,
    encode_properties,
)
from idemp.remoting.message import COMPRESS_OVER, compress_body, encode_stored_properties

from .golden import FRAMES, body
from .strategies import BATCH_ENTRIES, PROPERTIES, hosts, messages

V6_BITS = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6
SYSFLAG_AT = 36  # size magic crc queueId flag (5*4) + queueOffset + physicalOffset (2*8)


def expected_sys_flag(msg: MessageExt, original: int) -> int:
    flag = original & ~V6_BITS
    if ipaddress.ip_address(msg.born_host[0]).version == 6:
        flag |= MessageSysFlag.BORNHOST_V6
    if ipaddress.ip_address(msg.store_host[0]).version == 6:
        flag |= MessageSysFlag.STOREHOST_V6
    return flag


# --- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("born_v,store_v", [(4, 4), (4, 6), (6, 4), (6, 6)])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_message_round_trip(
    born_v: Literal[4, 6], store_v: Literal[4, 6], data: st.DataObject
) -> None:
    msg = data.draw(messages(born=hosts(born_v), store=hosts(store_v)))
    original = dataclasses.replace(msg)
    raw = encode_message(msg)
    sys_flag = expected_sys_flag(msg, original.sys_flag)
    assert struct.unpack_from(">i", raw, SYSFLAG_AT)[0] == sys_flag
    assert struct.unpack_from(">i", raw)[0] == len(raw)
    decoded, end = decode_message(raw)
    assert end == len(raw)
    assert decoded == dataclasses.replace(
        original,
        sys_flag=sys_flag,
        body_crc=zlib.crc32(original.body) & 0x7FFFFFFF,
        store_size=len(raw),
    )
    assert decoded == msg  # the encoder recorded the same sysFlag, crc and size on msg
    assert len(raw) == 91 + 12 * ((born_v == 6) + (store_v == 6)) + len(msg.body) + len(
        msg.topic.encode()
    ) + len(encode_stored_properties(msg.properties).encode())


@settings(max_examples=60, deadline=None)
@given(st.lists(messages(), min_size=0, max_size=4), st.binary(max_size=8))
def test_records_back_to_back(msgs: list[MessageExt], prefix: bytes) -> None:
    raws = [encode_message(m) for m in msgs]
    assert decode_messages(b"".join(raws)) == msgs
    assert decode_messages(memoryview(b"".join(raws))) == msgs
    pos = len(prefix)
    buf = prefix + b"".join(raws)
    for m in msgs:
        got, pos = decode_message(buf, pos)
        assert got == m
    assert pos == len(buf)


@settings(max_examples=100, deadline=None)
@given(messages(), st.binary(max_size=20_000))
def test_compressed_body_inflates(msg: MessageExt, payload: bytes) -> None:
    compressed = zlib.compress(payload, 5)
    msg.body = compressed
    msg.sys_flag |= MessageSysFlag.COMPRESSED
    raw = encode_message(msg)
    decoded, _ = decode_message(raw)
    assert decoded.body == payload
    assert decoded.sys_flag & MessageSysFlag.COMPRESSED
    assert decoded.body_crc == zlib.crc32(compressed) & 0x7FFFFFFF
    kept, _ = decode_message(raw, decompress=False)
    assert kept.body == compressed
    assert decode_messages(raw, decompress=False) == [kept]


def test_compress_body_threshold() -> None:
    small = b"a" * (COMPRESS_OVER - 1)
    assert compress_body(small, 4) == (small, 4)
    big = b"a" * COMPRESS_OVER
    data, flag = compress_body(big, 4)
    assert flag == 4 | MessageSysFlag.COMPRESSED
    assert zlib.decompress(data) == big and len(data) < len(big)


def test_encoder_clears_stale_v6_bits() -> None:
    msg = MessageExt(
        topic="T",
        born_host=("10.0.0.1", 1),
        store_host=("::1", 2),
        sys_flag=MessageSysFlag.BORNHOST_V6 | MessageSysFlag.TRANSACTION_PREPARED,
    )
    raw = encode_message(msg)
    want = MessageSysFlag.STOREHOST_V6 | MessageSysFlag.TRANSACTION_PREPARED
    assert struct.unpack_from(">i", raw, SYSFLAG_AT)[0] == want == msg.sys_flag
    decoded, _ = decode_message(raw)
    assert decoded.born_host == ("10.0.0.1", 1) and decoded.store_host == ("::1", 2)


def test_encoder_limits() -> None:
    with pytest.raises(MessageFormatError):
        encode_message(MessageExt(topic="t" * 128))
    encode_message(MessageExt(topic="t" * 127))
    with pytest.raises(MessageFormatError):
        encode_message(MessageExt(topic="T", properties={"k": "v" * 32766}))
    with pytest.raises(MessageFormatError):
        encode_batch([BatchEntry(b"", {"k": "v" * 32766})])


# --- properties ----------------------------------------------------------------------------


def test_properties_exact_form() -> None:
    assert encode_properties({"KEYS": "a b", "TAGS": "T"}) == "KEYS\x01a b\x02TAGS\x01T\x02"
    assert encode_properties({}) == ""
    # what a broker stores (Java 4.9.7's MessageDecoder.messageProperties2String)
    assert encode_stored_properties({"KEYS": "a b", "TAGS": "T"}) == "KEYS\x01a b\x02TAGS\x01T"
    assert encode_stored_properties({}) == ""
    assert decode_properties("") == {}
    assert decode_properties("KEYS\x01a b\x02TAGS\x01T") == {"KEYS": "a b", "TAGS": "T"}
    assert decode_properties("\x02\x02A\x011\x02\x01x\x02B\x01\x02C") == {"A": "1"}


@settings(max_examples=300, deadline=None)
@given(PROPERTIES)
def test_properties_round_trip(props: dict[str, str]) -> None:
    text = encode_properties(props)
    assert decode_properties(text) == props
    assert list(decode_properties(text)) == list(props)  # order kept
    if props:
        assert text.endswith("\x02")
        assert decode_properties(text[:-1]) == props  # Java's form, no trailing \x02
        assert encode_stored_properties(props) == text[:-1]
    assert text.count("\x01") == text.count("\x02") == len(props)


# --- batches -------------------------------------------------------------------------------


def test_batch_exact_bytes() -> None:
    assert encode_batch([BatchEntry(b"hi", {"K": "v"}, 3)]) == bytes.fromhex(
        "0000001c00000000000000000000000300000002686900044b017602"
    )
    assert encode_batch([]) == b""
    assert decode_batch(b"") == []


@settings(max_examples=200, deadline=None)
@given(st.lists(BATCH_ENTRIES, max_size=6))
def test_batch_round_trip(entries: list[BatchEntry]) -> None:
    raw = encode_batch(entries)
    assert decode_batch(raw) == entries
    assert decode_batch(memoryview(raw)) == entries


# --- hostile input ------------------------------------------------------------------------


def _record(sys_flag: int = 0) -> bytes:
    return encode_message(
        MessageExt(topic="Topic", body=b"body", properties={"A": "1"}, sys_flag=sys_flag)
    )


GOOD = _record()


def _patch(raw: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(raw)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


BODY_LEN_AT = 48 + 8 + 8 + 8 + 4 + 8  # head, born host, storeTs, store host, reconsume, prep
TOPIC_LEN_AT = BODY_LEN_AT + 4 + 4
PROPS_LEN_AT = TOPIC_LEN_AT + 1 + 5

BAD_RECORDS = {
    "bad magic": _patch(GOOD, 4, ">I", 0xCBD43194),
    "size below head": _patch(GOOD, 0, ">i", 47),
    "size negative": _patch(GOOD, 0, ">i", -5),
    "size past buffer": _patch(GOOD, 0, ">i", len(GOOD) + 1),
    "size larger than content": _patch(GOOD + b"\x00\x00", 0, ">i", len(GOOD) + 2),
    "size smaller than content": _patch(GOOD, 0, ">i", len(GOOD) - 1),
    "body length negative": _patch(GOOD, BODY_LEN_AT, ">i", -1),
    "body length past record": _patch(GOOD, BODY_LEN_AT, ">i", 1000),
    "topic length negative": _patch(GOOD, TOPIC_LEN_AT, ">b", -1),
    "topic length past record": _patch(GOOD, TOPIC_LEN_AT, ">b", 100),
    "props length negative": _patch(GOOD, PROPS_LEN_AT, ">h", -1),
    "props length past record": _patch(GOOD, PROPS_LEN_AT, ">h", 100),
    "topic not utf-8": GOOD[: TOPIC_LEN_AT + 1] + b"\xff" + GOOD[TOPIC_LEN_AT + 2 :],
    "props not utf-8": GOOD[:-1] + b"\xff",
    "compressed body does not inflate": _record(sys_flag=MessageSysFlag.COMPRESSED),
    "v6 flag on a v4 record": _patch(GOOD, SYSFLAG_AT, ">i", MessageSysFlag.BORNHOST_V6),
    "good record then junk": GOOD + b"\x00\x00\x00",
    "blank": bytes(8),
}


def test_bad_record_offsets_are_right() -> None:
    assert struct.unpack_from(">i", GOOD, BODY_LEN_AT)[0] == 4
    assert GOOD[TOPIC_LEN_AT] == 5 and GOOD[TOPIC_LEN_AT + 1 : TOPIC_LEN_AT + 6] == b"Topic"
    assert struct.unpack_from(">h", GOOD, PROPS_LEN_AT)[0] == 3  # "A\x011", no trailing separator


@pytest.mark.parametrize("name", sorted(BAD_RECORDS))
def test_bad_records(name: str) -> None:
    with pytest.raises(MessageFormatError):
        decode_messages(BAD_RECORDS[name])


def test_every_truncation_of_golden_records_is_refused() -> None:
    raw = body(FRAMES[152])  # two records
    first_end = decode_message(raw)[1]
    for cut in range(1, len(raw)):
        if cut == first_end:
            assert len(decode_messages(raw[:cut])) == 1
            continue
        with pytest.raises(MessageFormatError):
            decode_messages(raw[:cut])


GOOD_BATCH = encode_batch([BatchEntry(b"hello", {"K": "v"}, 0)])
BAD_BATCHES = {
    "size below minimum": _patch(GOOD_BATCH, 0, ">i", 21),
    "size negative": _patch(GOOD_BATCH, 0, ">i", -1),
    "size past buffer": _patch(GOOD_BATCH, 0, ">i", len(GOOD_BATCH) + 1),
    "body length negative": _patch(GOOD_BATCH, 16, ">i", -1),
    "body length past entry": _patch(GOOD_BATCH, 16, ">i", 100),
    "props length negative": _patch(GOOD_BATCH, 25, ">h", -1),
    "props length wrong": _patch(GOOD_BATCH, 25, ">h", 3),
    "props not utf-8": GOOD_BATCH[:-1] + b"\xff",
    "trailing junk": GOOD_BATCH + b"\x00\x00\x00",
}


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_bad_batches(name: str) -> None:
    with pytest.raises(MessageFormatError):
        decode_batch(BAD_BATCHES[name])


def test_every_truncation_of_a_batch_is_refused() -> None:
    raw = encode_batch([BatchEntry(b"one", {"A": "1"}), BatchEntry(b"two", {"B": "2"}, 7)])
    first_end = struct.unpack_from(">i", raw)[0]
    for cut in range(1, len(raw)):
        if cut == first_end:
            assert decode_batch(raw[:cut]) == [BatchEntry(b"one", {"A": "1"})]
            continue
        with pytest.raises(MessageFormatError):
            decode_batch(raw[:cut])


# --- fuzz --------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzz_messages_raise_only_message_format_error(data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        raw = data.draw(st.binary(max_size=400))
    else:
        buf = bytearray(encode_message(data.draw(messages())))
        for _ in range(data.draw(st.integers(1, 4))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        raw = bytes(buf[: data.draw(st.integers(0, len(buf)))])
    try:
        out = decode_messages(raw)
    except MessageFormatError:
        return
    assert all(isinstance(m, MessageExt) for m in out)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzz_batches_raise_only_message_format_error(data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        raw = data.draw(st.binary(max_size=400))
    else:
        buf = bytearray(encode_batch(data.draw(st.lists(BATCH_ENTRIES, min_size=1, max_size=3))))
        for _ in range(data.draw(st.integers(1, 4))):
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        raw = bytes(buf[: data.draw(st.integers(0, len(buf)))])
    try:
        out = decode_batch(raw)
    except MessageFormatError:
        return
    assert all(isinstance(e, BatchEntry) for e in out)
