"""Consume queues: per (topic, queueId) index of logical offset → commit-log record.

Held in memory as compact arrays and rebuilt from the commit log at start, so they
can never disagree with it. The tags code of a delayed message is its delivery time,
as in RocketMQ.
"""

from __future__ import annotations

import bisect
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
        """SEARCH_OFFSET_BY_TIMESTAMP: the entry stored at ``timestamp``, else the one
        nearest in time (the earlier one on a tie); past the end, the last entry."""
        n = len(self.store_ts)
        if n == 0:
            return 0
        i = bisect.bisect_left(self.store_ts, timestamp)
        if i < n and self.store_ts[i] == timestamp:
            return i
        if i == 0:
            return 0
        if i >= n:
            return n - 1
        before, after = self.store_ts[i - 1], self.store_ts[i]
        return i if after - timestamp < timestamp - before else i - 1
