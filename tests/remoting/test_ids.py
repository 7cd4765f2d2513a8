"""offsetMsgId, UNIQ_KEY generation and the Java tag hash."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idemp.remoting import (
    UniqKeyGenerator,
    java_string_hash,
    offset_msg_id,
    parse_offset_msg_id,
    parse_subscription,
)

from .strategies import hosts

INT64 = st.integers(-(2**63), 2**63 - 1)


def test_offset_msg_id_exact() -> None:
    assert offset_msg_id(("127.0.0.1", 10911), 0) == "7F00000100002A9F0000000000000000"
    assert offset_msg_id(("127.0.0.1", 10911), 2114) == "7F00000100002A9F0000000000000842"
    assert offset_msg_id(("::1", 10911), 5) == "0" * 31 + "1" + "00002A9F" + "0000000000000005"
    assert parse_offset_msg_id("7f00000100002a9f0000000000000842") == (("127.0.0.1", 10911), 2114)


@settings(max_examples=200, deadline=None)
@given(st.one_of(hosts(4), hosts(6)), INT64)
def test_offset_msg_id_round_trip(host: tuple[str, int], offset: int) -> None:
    msg_id = offset_msg_id(host, offset)
    assert len(msg_id) == (32 if ":" not in host[0] else 56)
    assert re.fullmatch("[0-9A-F]+", msg_id)
    assert parse_offset_msg_id(msg_id) == (host, offset)


@pytest.mark.parametrize("bad", ["", "7F", "7F00000100002A9F00000000000008", "Z" * 32, "0" * 34])
def test_parse_offset_msg_id_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_offset_msg_id(bad)


def test_uniq_keys() -> None:
    gen = UniqKeyGenerator(ip="10.1.2.3", pid=0x12345)
    ids = [gen.next_id() for _ in range(10_000)]
    assert all(re.fullmatch("[0-9A-F]{32}", i) for i in ids)
    assert len(set(ids)) == 10_000
    assert {i[:8] for i in ids} == {"0A010203"}
    assert {i[8:12] for i in ids} == {"2345"}  # pid & 0xFFFF
    assert len({i[:20] for i in ids}) == 1  # ip | pid | random: fixed per generator
    assert [int(i[-4:], 16) for i in ids[:3]] == [1, 2, 3]  # counter


def test_uniq_keys_default_and_v6() -> None:
    assert re.fullmatch("7F000001[0-9A-F]{24}", UniqKeyGenerator().next_id())
    assert re.fullmatch("0{31}1[0-9A-F]{24}", UniqKeyGenerator(ip="::1").next_id())


def test_java_string_hash_by_definition() -> None:
    for text in ("TagA", "a || b", "é", "\U0001f600x"):
        units = text.encode("utf-16-be")
        h = 0
        for i in range(0, len(units), 2):
            h = (31 * h + int.from_bytes(units[i : i + 2], "big")) % 2**32
        assert java_string_hash(text) == (h - 2**32 if h >= 2**31 else h)


def test_parse_subscription() -> None:
    assert parse_subscription(None) is None
    assert parse_subscription("*") is None
    assert parse_subscription(" ") is None
    assert parse_subscription("||") is None
    assert parse_subscription(" TagA || TagB ||") == (
        frozenset({"TagA", "TagB"}),
        frozenset({2598919, java_string_hash("TagB")}),
    )
