"""Hypothesis strategies shared by the remoting tests."""

from __future__ import annotations

from typing import Literal

from hypothesis import strategies as st

from idemp.remoting import BatchEntry, LanguageCode, MessageExt, RemotingCommand, SerializeType

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
LANGUAGES = st.sampled_from([c.name for c in LanguageCode])

# Property names/values: non-empty, free of the two separators.
PROP_TEXT = st.text(
    st.characters(exclude_characters="\x01\x02", exclude_categories=["Cs"]),
    min_size=1,
    max_size=20,
)
PROPERTIES = st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=8)


@st.composite
def commands(draw: st.DrawFn, serialize_type: int | None = None) -> RemotingCommand:
    ser = draw(st.sampled_from(list(SerializeType))) if serialize_type is None else serialize_type
    binary = ser == SerializeType.ROCKETMQ
    return RemotingCommand(
        code=draw(INT16 if binary else INT32),
        opaque=draw(INT32),
        flag=draw(INT32),
        language=draw(LANGUAGES),
        version=draw(INT16 if binary else INT32),
        remark=draw(st.none() | st.text(max_size=40)),
        ext_fields=draw(
            st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=40), max_size=8)
        ),
        body=draw(st.binary(max_size=300)),
        serialize_type=int(ser),
    )


def expected_after_wire(cmd: RemotingCommand) -> RemotingCommand:
    """What the peer decodes: the binary form (like Java) cannot tell "" from null remark."""
    remark = cmd.remark
    if cmd.serialize_type == SerializeType.ROCKETMQ and not remark:
        remark = None
    return RemotingCommand(
        code=cmd.code,
        opaque=cmd.opaque,
        flag=cmd.flag,
        language=cmd.language,
        version=cmd.version,
        remark=remark,
        ext_fields=dict(cmd.ext_fields),
        body=cmd.body,
        serialize_type=cmd.serialize_type,
    )


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` split at arbitrary points (empty chunks included)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def hosts(version: Literal[4, 6] | None = None) -> st.SearchStrategy[tuple[str, int]]:
    addrs = st.ip_addresses(v=version) if version else st.ip_addresses()
    return st.tuples(addrs.map(str), st.integers(0, 65535))


TOPICS = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40).filter(
    lambda t: len(t.encode("utf-8")) <= 127
)


@st.composite
def messages(
    draw: st.DrawFn,
    born: st.SearchStrategy[tuple[str, int]] | None = None,
    store: st.SearchStrategy[tuple[str, int]] | None = None,
) -> MessageExt:
    """A record without the COMPRESSED bit (any other sysFlag bits, V6 bits included)."""
    return MessageExt(
        topic=draw(TOPICS),
        body=draw(st.binary(max_size=200)),
        properties=draw(PROPERTIES),
        flag=draw(INT32),
        queue_id=draw(INT32),
        queue_offset=draw(INT64),
        commit_log_offset=draw(INT64),
        sys_flag=draw(st.integers(0, 2**31 - 1)) & ~0x1,
        born_timestamp=draw(INT64),
        born_host=draw(born if born is not None else hosts()),
        store_timestamp=draw(INT64),
        store_host=draw(store if store is not None else hosts()),
        reconsume_times=draw(INT32),
        prepared_transaction_offset=draw(INT64),
    )


BATCH_ENTRIES = st.builds(
    BatchEntry, body=st.binary(max_size=200), properties=PROPERTIES, flag=INT32
)
