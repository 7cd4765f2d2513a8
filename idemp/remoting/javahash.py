"""Java's String.hashCode, and the order a java.util.HashMap iterates its keys in.

RocketMQ's answers list what they take from hash maps in that order (a route's brokers,
for one), and its tools print them so.
"""

from __future__ import annotations

from collections.abc import Iterable


def java_string_hash(text: str) -> int:
    """Java ``String.hashCode`` over UTF-16 code units, as a signed int32."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def hash_map_order(keys: Iterable[str], capacity: int = 16) -> list[str]:
    """The keys as a HashMap created with ``capacity`` and filled in this order iterates
    them: by bucket (the spread hash's low bits, the table doubling past 3/4 full), in
    insertion order within a bucket."""
    items = list(dict.fromkeys(keys))
    while len(items) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str) -> int:
        h = java_string_hash(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(items, key=bucket)  # stable: insertion order within a bucket
