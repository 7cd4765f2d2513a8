"""Which queue an orderly send picks for a sharding key.

The official Python client (rocketmq-client-python, C++ inside) sends
``send_orderly_with_sharding_key`` to ``std::hash<std::string>(key) % len(queues)``
over the topic's publish queues. With libstdc++ on 64-bit Linux ``std::hash`` of a
string is ``_Hash_bytes(data, len, 0xc70f6907)``, a MurmurHash2-64A variant. idemp
computes the same value so that idemp and official producers keep one key on one
queue (verified against the wheel by tests/client/test_interop.py).
"""

from __future__ import annotations

_MUL = 0xC6A4A7935BD1E995
_MASK = (1 << 64) - 1
STD_HASH_SEED = 0xC70F6907


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def std_hash_bytes(data: bytes, seed: int = STD_HASH_SEED) -> int:
    """libstdc++ ``std::_Hash_bytes`` for 64-bit ``size_t`` (hash_bytes.cc)."""
    n = len(data)
    aligned = n & ~7
    h = (seed ^ (n * _MUL)) & _MASK
    for i in range(0, aligned, 8):
        k = int.from_bytes(data[i : i + 8], "little")
        k = (_shift_mix((k * _MUL) & _MASK) * _MUL) & _MASK
        h ^= k
        h = (h * _MUL) & _MASK
    if n & 7:
        k = int.from_bytes(data[aligned:], "little")
        h ^= k
        h = (h * _MUL) & _MASK
    h = (_shift_mix(h) * _MUL) & _MASK
    return _shift_mix(h)


def std_hash_string(key: str) -> int:
    return std_hash_bytes(key.encode("utf-8"))


def queue_index_for_key(key: str, queue_count: int) -> int:
    """``std::hash<std::string>(key) % queue_count``, as the official C++ client."""
    if queue_count <= 0:
        raise ValueError("a topic with no writable queue has no queue for any key")
    return std_hash_string(key) % queue_count
