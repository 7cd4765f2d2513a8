"""Consume queues: per (topic, queueId) index of logical offset → commit-log record.

Held in memory as compact arrays and rebuilt from the commit log at start, so they
can never disagree with it. The tags code of a delayed message is its delivery time,
as in RocketMQ.
"""

from __future__ import annotations

from array import array


class ConsumeQueue:
    __slots__ = ("phy", "size", "tags", "store_ts", "min_offset")

    def __init__(self) -> None:
        self.phy = array("q")
        self.size = array("i")
        self.tags = array("q")
        self.store_ts = array("q")
        self.min_offset = 0

    @property
    def max_offset(self) -> int:
        """The next offset to be written (= number of entries)."""
        return len(self.phy)

    def append(self, phy: int, size: int, tags_code: int, store_ts: int) -> int:
        offset = len(self.phy)
        self.phy.append(phy)
        self.size.append(size)
        self.tags.append(tags_code)
        self.store_ts.append(store_ts)
        return offset

    def store_time(self, offset: int) -> int:
        """DefaultMessageStore.getMessageStoreTimeStamp: -1 outside the queue."""
        if not self.min_offset <= offset < len(self.store_ts):
            return -1
        return self.store_ts[offset]

    def offset_by_time(self, timestamp: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP by ConsumeQueue.getOffsetInQueueByTime's binary
        search: the first entry it meets stored at ``timestamp`` (of a batch's, which share
        one, not necessarily the first), else the one nearest in time (the earlier on a
        tie); before the first, the first; past the end, the last."""
        ts = self.store_ts
        low, high = 0, len(ts) - 1
        left = right = -1
        left_ts: int | None = None
        right_ts: int | None = None
        while high >= low:
            mid = (low + high) // 2
            if ts[mid] == timestamp:
                return mid
            if ts[mid] > timestamp:
                high, right, right_ts = mid - 1, mid, ts[mid]
            else:
                low, left, left_ts = mid + 1, mid, ts[mid]
        if left_ts is None:
            return max(right, 0)
        if right_ts is None:
            return left
        return right if timestamp - left_ts > right_ts - timestamp else left
