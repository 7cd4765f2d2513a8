"""RocketMQ's disk-full guard: above ``diskSpaceWarningLevelRatio`` the broker refuses
what producers write, and keeps serving reads.

RocketMQ marks its store not writable when the commit log's partition is fuller than the
ratio (``DefaultMessageStore.CleanCommitLogService.isSpaceFull``, checked 1 s after start
and every 10 s), and every put then fails with ``SERVICE_NOT_AVAILABLE``: a send gets
code 14 with the partition's use in its remark, a send-back code 1, a commit of a
transaction code 14. A broker that keeps writing into a full disk loses the log's tail
instead; one that refuses lets producers fail over and operators see why.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import BrokerConfig

log = logging.getLogger("idemp.broker.store")

CHECK_INTERVAL_S = 10.0  # RocketMQ's diskCheckScheduledExecutorService period
MAX_RATIO_PERCENT = 90  # RocketMQ 5 lowers a higher setting to 90


class DiskFull(Exception):
    """The store refuses writes: its partition is over ``diskSpaceWarningLevelRatio``."""


def disk_used_ratio(path: Path) -> float:
    """UtilAll.getDiskPartitionSpaceUsedPercent: used over used + usable (the blocks
    reserved for root count as neither), rounded up to a hundredth; -1 when unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    entire = used + st.f_bavail * st.f_frsize
    if st.f_blocks <= 0 or entire <= 0:
        return -1.0
    return -(-used * 100 // entire) / 100.0


class DiskGuard:
    """The store's writable flag, as RocketMQ's ``RunningFlags`` disk bit."""

    def __init__(self, root: Path, config: BrokerConfig) -> None:
        self.root = root
        self.config = config
        self.full = False

    @property
    def threshold(self) -> float:
        """The ratio as a fraction. RocketMQ 5.3 also raises a setting under 35 to 35;
        idemp keeps it, so that the refusal can be seen on a disk that is not full."""
        percent = min(max(self.config.diskSpaceWarningLevelRatio, 0), MAX_RATIO_PERCENT)
        return percent / 100.0

    def check(self) -> bool:
        """Measure the commit log's partition and set the flag; True when full."""
        ratio = disk_used_ratio(self.root / "commitlog")
        full = ratio > self.threshold
        if full and not self.full:
            log.error(
                "the disk of the commit log is %.2f used, over diskSpaceWarningLevelRatio "
                "%.2f: refusing writes until it is not",
                ratio,
                self.threshold,
            )
        elif self.full and not full:
            log.info("the disk of the commit log is %.2f used: writes accepted again", ratio)
        self.full = full
        return full

    def usage(self, has_messages: bool) -> str:
        """SendMessageProcessor.diskUtil: the commit log's, consume queues' and index's
        partitions (one here). RocketMQ's index directory appears with the first message
        stored; before it, the index's figure is -1."""
        ratio = disk_used_ratio(self.root / "commitlog")
        index = ratio if has_messages else -1.0
        return f"CL: {ratio:5.2f} CQ: {ratio:5.2f} INDEX: {index:5.2f}"

    def send_refusal(self, has_messages: bool) -> str:
        """The remark of a refused send (SERVICE_NOT_AVAILABLE), word for word."""
        return (
            "service not available now. It may be caused by one of the following reasons: "
            f"the broker's disk is full [{self.usage(has_messages)}], messages are put to "
            "the slave, message store has been shut down, etc."
        )
