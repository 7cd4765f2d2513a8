"""HPACK (RFC 7541) as the gRPC endpoint needs it: a decoder for request headers, and the
few constant blocks a gRPC server answers with.

Why not ``hpack.Decoder``: it spends ~35 µs on a 5.x client's header block of 17 fields,
a tenth of what a whole SendMessage costs the broker. grpc's clients send those fields
as plain literals (no Huffman), so a decoder that slices them is four times faster. The
``hpack`` library still provides what is data, not logic: the static table and the Huffman
code, used for the literals other clients compress.
"""

from __future__ import annotations

from collections import deque

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

STATIC = tuple(
    (name.decode("ascii"), value.decode("ascii")) for name, value in HeaderTable.STATIC_TABLE
)
DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE, which the endpoint never changes
ENTRY_OVERHEAD = 32  # RFC 7541 §4.1


class HeaderError(ValueError):
    """A header block that cannot be decoded: HTTP/2's COMPRESSION_ERROR."""


class HeaderDecoder:
    """One connection's decoding context: the dynamic table lives across header blocks."""

    def __init__(self, max_size: int = DEFAULT_TABLE_SIZE) -> None:
        self.limit = max_size  # what the peer may set the table's size to
        self.max_size = max_size
        self.size = 0
        self.table: deque[tuple[str, str, int]] = deque()  # newest first

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        headers: list[tuple[str, str]] = []
        append = headers.append
        pos, end = 0, len(block)
        try:
            while pos < end:
                first = block[pos]
                if first & 0x80:  # indexed field
                    index, pos = _integer(block, pos, 0x7F)
                    append(self._lookup(index))
                    continue
                if first & 0x40:  # literal, added to the table
                    index, pos = _integer(block, pos, 0x3F)
                    name, value, pos = self._literal(block, pos, index)
                    append((name, value))
                    self._add(name, value)
                    continue
                if first & 0x20:  # table size update
                    size, pos = _integer(block, pos, 0x1F)
                    if size > self.limit:
                        raise HeaderError(f"table size {size} over the limit {self.limit}")
                    self.max_size = size
                    self._evict(0)
                    continue
                index, pos = _integer(block, pos, 0x0F)  # literal, not added (or never)
                name, value, pos = self._literal(block, pos, index)
                append((name, value))
        except IndexError:
            raise HeaderError("header block truncated") from None
        return headers

    def _literal(self, block: bytes, pos: int, index: int) -> tuple[str, str, int]:
        if index:
            name = self._lookup(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return name, value, pos

    def _lookup(self, index: int) -> tuple[str, str]:
        if 0 < index <= 61:
            return STATIC[index - 1]
        dynamic = index - 62
        if index == 0 or dynamic >= len(self.table):
            raise HeaderError(f"header index {index} is not in the table")
        name, value, _ = self.table[dynamic]
        return name, value

    def _add(self, name: str, value: str) -> None:
        size = len(name.encode()) + len(value.encode()) + ENTRY_OVERHEAD
        if size > self.max_size:  # RFC 7541 §4.4: the table empties, nothing is added
            self.table.clear()
            self.size = 0
            return
        self._evict(size)
        self.table.appendleft((name, value, size))
        self.size += size

    def _evict(self, room: int) -> None:
        while self.table and self.size + room > self.max_size:
            self.size -= self.table.pop()[2]


def _integer(block: bytes, pos: int, mask: int) -> tuple[int, int]:
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        octet = block[pos]
        pos += 1
        value += (octet & 0x7F) << shift
        if not octet & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise HeaderError("header integer too large")


def _string(block: bytes, pos: int) -> tuple[str, int]:
    huffman = block[pos] & 0x80
    length, pos = _integer(block, pos, 0x7F)
    end = pos + length
    if end > len(block):
        raise HeaderError("header string runs past the block")
    raw = block[pos:end]
    if huffman:
        try:
            raw = decode_huffman(raw)
        except Exception as exc:  # hpack's HPACKDecodingError
            raise HeaderError(f"bad Huffman string: {exc}") from None
    return raw.decode("utf-8", "replace"), end


def _literal_field(name: str, value: str) -> bytes:
    """A literal without indexing with a new name: the endpoint's table stays empty."""
    return b"\x00" + _octets(name.encode()) + _octets(value.encode())


def _octets(data: bytes) -> bytes:
    length = len(data)
    if length < 0x7F:
        return bytes([length]) + data
    out = bytearray([0x7F])
    length -= 0x7F
    while length >= 0x80:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    return bytes(out) + data


def encode(headers: list[tuple[str, str]]) -> bytes:
    """A header block of literals only: no state shared with the peer's decoder."""
    return b"".join(_literal_field(name, value) for name, value in headers)


# ":status: 200" is static entry 8; "content-type" is static name 31 (literal, not indexed)
RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + _octets(b"application/grpc")
