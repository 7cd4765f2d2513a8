"""Queue allocation among the consumers of a group (AllocateMessageQueueStrategy).

Every consumer computes the same answer from the same sorted inputs, so no
coordination is needed beyond the broker's consumer list.
"""

from __future__ import annotations

import bisect
import hashlib

from .route import MessageQueue


def allocate_average(
    group: str, client_id: str, mqs: list[MessageQueue], cids: list[str]
) -> list[MessageQueue]:
    """Java's AllocateMessageQueueAveragely: contiguous ranges, the first
    ``len(mqs) % len(cids)`` consumers get one queue more."""
    mqs = sorted(mqs)
    cids = sorted(cids)
    if client_id not in cids or not mqs:
        return []
    index = cids.index(client_id)
    n, m = len(mqs), len(cids)
    mod = n % m
    if n <= m:
        size = 1
    elif mod > 0 and index < mod:
        size = n // m + 1
    else:
        size = n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n - start)
    return [mqs[(start + i) % n] for i in range(max(0, count))]


def _md5_long(text: str) -> int:
    """Java's ConsistentHashRouter MD5Hash: the first 4 digest bytes, little-endian."""
    d = hashlib.md5(text.encode("utf-8")).digest()
    return (d[3] << 24) | (d[2] << 16) | (d[1] << 8) | d[0]


def allocate_consistent_hash(
    group: str,
    client_id: str,
    mqs: list[MessageQueue],
    cids: list[str],
    virtual_nodes: int = 10,
) -> list[MessageQueue]:
    """AllocateMessageQueueConsistentHash: a queue goes to the first virtual node at or
    after its hash on the ring (so a consumer leaving moves only its own queues)."""
    if client_id not in cids or not mqs:
        return []
    ring: list[tuple[int, str]] = sorted(
        (_md5_long(f"{cid}{i}"), cid) for cid in sorted(cids) for i in range(virtual_nodes)
    )
    keys = [k for k, _ in ring]
    out: list[MessageQueue] = []
    for mq in sorted(mqs):
        h = _md5_long(
            f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"
        )
        i = bisect.bisect_left(keys, h)
        owner = ring[i % len(ring)][1]
        if owner == client_id:
            out.append(mq)
    return out
