"""Message encodings: the stored/pulled record, the property string, batch bodies.

The stored record is what a PULL, VIEW, QUERY or CHECK_TRANSACTION_STATE body holds,
and what idemp's broker writes to its commit log, so a pull is a slice of the log.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .codes import MessageSysFlag, Prop

MESSAGE_MAGIC = 0xDAA320A7 - (1 << 32)  # -626843481 as a signed int32
BLANK_MAGIC = 0xCBD43194 - (1 << 32)
COMPRESS_OVER = 4096  # compressMsgBodyOverHowmuch
COMPRESS_LEVEL = 5

PROPERTY_SEPARATOR = "\x02"
NAME_VALUE_SEPARATOR = "\x01"

Host = tuple[str, int]


class MessageFormatError(ValueError):
    """Bytes that do not hold a valid stored message, batch or property string."""


def encode_properties(props: dict[str, str]) -> str:
    """``k\\x01v\\x02`` per pair, with the trailing ``\\x02`` the C++ client writes."""
    return "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())


def encode_stored_properties(props: dict[str, str]) -> str:
    """The Java broker's form (``MessageDecoder.messageProperties2String``): no trailing
    ``\x02``. A stored record's size, and so every later physical offset, depends on it."""
    return PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items())


def decode_properties(text: str) -> dict[str, str]:
    """Accept both the trailing-separator (C++) and the Java forms; skip empty names."""
    props: dict[str, str] = {}
    if not text:
        return props
    items = text.split(PROPERTY_SEPARATOR)
    if not items[-1]:
        items.pop()  # the trailing separator
    try:  # the well-formed case in one C-level pass; anything odd takes the loop below
        props = dict(item.split(NAME_VALUE_SEPARATOR, 1) for item in items)
    except ValueError:
        props = {}
    else:
        if "" not in props and all(props.values()):
            return props
        props = {}
    for item in items:
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep and name and value:
            props[name] = value
    return props


@functools.lru_cache(maxsize=1024)
def _packed_ip(text: str) -> tuple[bytes, bool]:
    """Parsed once per address: every stored message packs its born and store hosts, and
    ``ipaddress`` parsing is ~5 µs each; a broker sees a handful of distinct hosts."""
    addr = ipaddress.ip_address(text)
    return addr.packed, addr.version == 6


def _pack_host(host: Host) -> tuple[bytes, bool]:
    packed, v6 = _packed_ip(host[0])
    return packed + struct.pack(">i", host[1]), v6


_IP_TEXT: dict[bytes, str] = {}  # a pull holds a handful of distinct hosts


def _unpack_host(buf: bytes | memoryview, pos: int, v6: bool) -> tuple[Host, int]:
    size = 16 if v6 else 4
    ip = _ip_text(bytes(buf[pos : pos + size]))
    (port,) = struct.unpack_from(">i", buf, pos + size)
    return (ip, port), pos + size + 4


@dataclass(slots=True)
class MessageExt:
    """A message as stored by a broker and delivered by a pull."""

    topic: str
    body: bytes = b""
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    queue_id: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: Host = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0
    store_size: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(Prop.TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(Prop.KEYS, "")
        return [k for k in raw.split(" ") if k]

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(Prop.UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        from .msgid import offset_msg_id

        return offset_msg_id(self.store_host, self.commit_log_offset)

    @property
    def msg_id(self) -> str:
        """The client-visible id: UNIQ_KEY, falling back to the offsetMsgId."""
        return self.uniq_key or self.offset_msg_id


# Fixed part up to and including PreparedTransactionOffset, for IPv4 hosts.
_HEAD = struct.Struct(">iiiiiqqiq")  # size magic crc queueId flag qoff phyoff sysflag born
_TAIL_TS = struct.Struct(">q")
_BYTE = struct.Struct(">b")
_SHORT = struct.Struct(">h")
_MID = struct.Struct(">iq")  # reconsumeTimes preparedTransactionOffset
# Both hosts IPv4 (the common case): born host+port, store timestamp, store host+port,
# reconsumeTimes, preparedTransactionOffset, body length in one unpack.
_V4_MIDDLE = struct.Struct(">4siq4siiqi")
_ANY_V6 = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6


def _ip_text(raw: bytes) -> str:
    ip = _IP_TEXT.get(raw)
    if ip is None:
        ip = str(ipaddress.ip_address(raw))
        if len(_IP_TEXT) < 4096:
            _IP_TEXT[raw] = ip
    return ip


def body_crc(body: bytes) -> int:
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_message(msg: MessageExt, *, properties_text: str | None = None) -> bytes:
    """Encode one stored record. ``msg.body`` is written as is (already compressed if
    the COMPRESSED sysFlag bit is set). Host address families set the V6 sysFlag bits."""
    born, born_v6 = _pack_host(msg.born_host)
    store, store_v6 = _pack_host(msg.store_host)
    sys_flag = msg.sys_flag & ~(MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOST_V6)
    if born_v6:
        sys_flag |= MessageSysFlag.BORNHOST_V6
    if store_v6:
        sys_flag |= MessageSysFlag.STOREHOST_V6
    topic = msg.topic.encode("utf-8")
    if len(topic) > 127:
        raise MessageFormatError(f"topic {msg.topic!r} is longer than 127 bytes")
    props = (
        properties_text if properties_text is not None else encode_stored_properties(msg.properties)
    ).encode("utf-8")
    if len(props) > 32767:
        raise MessageFormatError(f"properties of {len(props)} bytes exceed 32767")
    body = msg.body
    crc = body_crc(body)
    size = (
        _HEAD.size
        + len(born)
        + 8
        + len(store)
        + _MID.size
        + 4
        + len(body)
        + 1
        + len(topic)
        + 2
        + len(props)
    )
    out = b"".join(
        (
            _HEAD.pack(
                size,
                MESSAGE_MAGIC,
                crc,
                msg.queue_id,
                msg.flag,
                msg.queue_offset,
                msg.commit_log_offset,
                sys_flag,
                msg.born_timestamp,
            ),
            born,
            _TAIL_TS.pack(msg.store_timestamp),
            store,
            _MID.pack(msg.reconsume_times, msg.prepared_transaction_offset),
            struct.pack(">i", len(body)),
            body,
            struct.pack(">b", len(topic)),
            topic,
            struct.pack(">h", len(props)),
            props,
        )
    )
    msg.sys_flag = sys_flag
    msg.body_crc = crc
    msg.store_size = size
    return out


def decode_message(
    buf: bytes | memoryview, pos: int = 0, *, decompress: bool = True
) -> tuple[MessageExt, int]:
    """Decode the record at ``pos``; return it and the position after it."""
    try:
        (size, magic, crc, queue_id, flag, qoff, phyoff, sys_flag, born_ts) = _HEAD.unpack_from(
            buf, pos
        )
        if size < _HEAD.size or pos + size > len(buf):
            raise MessageFormatError(f"record size {size} at {pos} is out of range")
        if magic != MESSAGE_MAGIC:
            raise MessageFormatError(f"bad magic code {magic & 0xFFFFFFFF:#x} at {pos}")
        end = pos + size
        p = pos + _HEAD.size
        if not sys_flag & _ANY_V6:  # one unpack instead of seven: pulls are hot
            (born_ip, born_port, store_ts, store_ip, store_port, reconsume, prepared, body_len) = (
                _V4_MIDDLE.unpack_from(buf, p)
            )
            born_host = (_ip_text(born_ip), born_port)
            store_host = (_ip_text(store_ip), store_port)
            p += _V4_MIDDLE.size
        else:
            born_host, p = _unpack_host(buf, p, bool(sys_flag & MessageSysFlag.BORNHOST_V6))
            (store_ts,) = _TAIL_TS.unpack_from(buf, p)
            p += 8
            store_host, p = _unpack_host(buf, p, bool(sys_flag & MessageSysFlag.STOREHOST_V6))
            reconsume, prepared = _MID.unpack_from(buf, p)
            p += _MID.size
            (body_len,) = struct.unpack_from(">i", buf, p)
            p += 4
        if body_len < 0 or p + body_len > end:
            raise MessageFormatError(f"body length {body_len} out of range at {pos}")
        body = bytes(buf[p : p + body_len])
        p += body_len
        (topic_len,) = _BYTE.unpack_from(buf, p)
        p += 1
        if topic_len < 0 or p + topic_len > end:
            raise MessageFormatError(f"topic length {topic_len} out of range at {pos}")
        topic = str(buf[p : p + topic_len], "utf-8")
        p += topic_len
        (props_len,) = _SHORT.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len > end:
            raise MessageFormatError(f"properties length {props_len} out of range at {pos}")
        props = decode_properties(str(buf[p : p + props_len], "utf-8"))
        p += props_len
    except struct.error as exc:
        raise MessageFormatError(f"truncated message record at {pos}: {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, MessageFormatError):
            raise
        raise MessageFormatError(f"invalid message record at {pos}: {exc}") from None
    if p != end:
        raise MessageFormatError(f"record at {pos} declares {size} bytes but holds {p - pos}")
    if decompress and sys_flag & MessageSysFlag.COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            raise MessageFormatError(f"compressed body at {pos} does not inflate: {exc}") from None
    # positional, in the fields' order: sixteen keywords cost a pull 0.3 µs a message
    msg = MessageExt(
        topic,
        body,
        props,
        flag,
        queue_id,
        qoff,  # queue_offset
        phyoff,  # commit_log_offset
        sys_flag,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,  # reconsume_times
        prepared,  # prepared_transaction_offset
        crc,  # body_crc
        size,  # store_size
    )
    return msg, end


def decode_messages(buf: bytes | memoryview, *, decompress: bool = True) -> list[MessageExt]:
    out: list[MessageExt] = []
    pos = 0
    while pos < len(buf):
        msg, pos = decode_message(buf, pos, decompress=decompress)
        out.append(msg)
    return out


def compress_body(body: bytes, sys_flag: int = 0) -> tuple[bytes, int]:
    """Compress a single message's body as the official producers do (>= 4 KiB, zlib 5)."""
    if len(body) >= COMPRESS_OVER:
        return zlib.compress(body, COMPRESS_LEVEL), sys_flag | MessageSysFlag.COMPRESSED
    return body, sys_flag


# --- batch bodies (MessageDecoder.encodeMessages / decodeMessages) --------------------


@dataclass(slots=True)
class BatchEntry:
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    # the properties as the sender wrote them (decoded entries only): a Java broker
    # stores that text verbatim, followed by the batch's own properties
    properties_text: str | None = field(default=None, compare=False, repr=False)


def encode_batch(entries: Iterable[BatchEntry]) -> bytes:
    parts: list[bytes] = []
    for e in entries:
        props = encode_properties(e.properties).encode("utf-8")
        if len(props) > 32767:
            raise MessageFormatError(f"batch entry properties of {len(props)} bytes exceed 32767")
        size = 4 + 4 + 4 + 4 + 4 + len(e.body) + 2 + len(props)
        parts.append(struct.pack(">iiiii", size, 0, 0, e.flag, len(e.body)))
        parts.append(e.body)
        parts.append(struct.pack(">h", len(props)))
        parts.append(props)
    return b"".join(parts)


def iter_batch(buf: bytes | memoryview) -> Iterator[BatchEntry]:
    pos = 0
    n = len(buf)
    while pos < n:
        try:
            size, _magic, _crc, flag, body_len = struct.unpack_from(">iiiii", buf, pos)
            if size < 22 or pos + size > n:
                raise MessageFormatError(f"batch entry size {size} at {pos} is out of range")
            p = pos + 20
            if body_len < 0 or p + body_len > pos + size:
                raise MessageFormatError(f"batch entry body length {body_len} out of range")
            body = bytes(buf[p : p + body_len])
            p += body_len
            (props_len,) = struct.unpack_from(">h", buf, p)
            p += 2
            if props_len < 0 or p + props_len != pos + size:
                raise MessageFormatError(f"batch entry properties length {props_len} is wrong")
            props_text = bytes(buf[p : p + props_len]).decode("utf-8")
            props = decode_properties(props_text)
        except struct.error as exc:
            raise MessageFormatError(f"truncated batch entry at {pos}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise MessageFormatError(f"batch entry properties are not UTF-8: {exc}") from None
        yield BatchEntry(body=body, properties=props, flag=flag, properties_text=props_text)
        pos += size


def decode_batch(buf: bytes | memoryview) -> list[BatchEntry]:
    return list(iter_batch(buf))
