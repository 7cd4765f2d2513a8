"""The broker's figures, as RocketMQ keeps them for its admin tools.

Two layers, as in RocketMQ 4.9.7: the store's counters (StoreStatsService: put times and
sizes, put latency, get found/miss/transferred, sampled every second for the 10 s, 60 s
and 600 s TPS of ``brokerStatus``) and per-topic / per-group counters
(BrokerStatsManager: TOPIC_PUT_NUMS, GROUP_GET_NUMS… sampled into minute, hour and day
windows for ``statsAll`` and ``clusterList -m``). Only what idemp's broker really does is
counted; nothing is made up.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# StoreStatsService.PUT_MESSAGE_ENTIRE_TIME_MAX_DESC: the put latency buckets (ms)
_BUCKET_LIMITS = (0, 10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000)
_BUCKET_NAMES = (
    "<=0ms",
    "0~10ms",
    "10~50ms",
    "50~100ms",
    "100~200ms",
    "200~500ms",
    "500ms~1s",
    "1~2s",
    "2~3s",
    "3~4s",
    "4~5s",
    "5~10s",
    "10s~",
)
_SAMPLES = 601  # one per second: enough for the 600 s TPS
# StoreStatsService.PUT_MESSAGE_ENTIRE_TIME_BUCKETS: (step ms, how many) -> the upper
# bounds of the finer buckets putLatency99/999 interpolate in, then one unbounded bucket
_LATENCY_BOUNDS: tuple[int, ...] = tuple(
    itertools.accumulate(
        step
        for step, times in ((1, 20), (2, 15), (5, 10), (10, 10), (50, 6), (100, 5), (1000, 9))
        for _ in range(times)
    )
) + (2**63 - 1,)
_PRINT_INTERVAL_MS = 60_000  # StoreStatsService.printTPSInterval: the windows roll over

# BrokerStatsManager item names (the statsName of VIEW_BROKER_STATS_DATA)
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
GROUP_GET_LATENCY = "GROUP_GET_LATENCY"
# per queue (enableDetailStat, on by default); RocketMQ 4.9.7 counts only the schedule
# topic's queues: puts as sends and send-backs are delayed, gets as they come due
QUEUE_PUT_NUMS = "QUEUE_PUT_NUMS"
QUEUE_PUT_SIZE = "QUEUE_PUT_SIZE"
QUEUE_GET_NUMS = "QUEUE_GET_NUMS"
QUEUE_GET_SIZE = "QUEUE_GET_SIZE"


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class _Item:
    """One counter (StatsItem): a value and a number of times, with samples for the
    minute (every 10 s), hour (every 10 min) and day (every hour) windows."""

    value: int = 0
    times: int = 0
    minute: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=7))
    hour: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=7))
    day: deque[tuple[int, int, int]] = field(default_factory=lambda: deque(maxlen=25))

    def sample(self, window: deque[tuple[int, int, int]], now: int, period_ms: int) -> None:
        """StatsItem.samplingInXxx: a window's first sample is preceded by a zero one
        period earlier, so what was counted before it shows in the window."""
        if not window:
            window.append((now - period_ms, 0, 0))
        window.append((now, self.value, self.times))

    @staticmethod
    def window_stats(window: deque[tuple[int, int, int]]) -> dict[str, Any]:
        """StatsItem.computeStatsData: sum, tps and average per call between the first
        and last samples of a window (zero until the sampler has seen the counter)."""
        if not window:
            return {"sum": 0, "tps": 0.0, "avgpt": 0.0}
        first, last = window[0], window[-1]
        total = last[1] - first[1]
        span = last[0] - first[0]
        times = last[2] - first[2]
        return {
            "sum": total,
            "tps": total * 1000.0 / span if span else 0.0,
            "avgpt": total / times if times else 0.0,
        }


class BrokerStats:
    def __init__(self, clock: Callable[[], int] = _now_ms) -> None:
        self.clock = clock
        self.boot_ms = clock()
        # store level
        self.put_times = 0
        self.put_size = 0
        self.put_failed = 0
        self.put_max_ms = 0
        # the put latency of the current minute; RocketMQ reports the last finished one
        # (none during the first minute: "null" and 0.00)
        self.put_buckets = [0] * len(_BUCKET_NAMES)
        self.last_put_buckets: list[int] | None = None
        self.latency = [0] * len(_LATENCY_BOUNDS)
        self.last_latency = [0] * len(_LATENCY_BOUNDS)
        self.get_found = 0
        self.get_miss = 0
        self.get_transferred = 0
        self.get_max_ms = 0
        self._samples: deque[tuple[int, int, int, int, int]] = deque(maxlen=_SAMPLES)
        # broker level: (statsName, key) -> item
        self.items: dict[tuple[str, str], _Item] = {}
        self.put_today_morning = 0
        self.put_yesterday_morning = 0
        self.get_today_morning = 0
        self.get_yesterday_morning = 0
        self._day = time.localtime().tm_yday
        self._last_minute = self._last_hour = self._last_day = 0
        self._last_print = self.boot_ms
        self.sample(force=True)

    # --- counting ------------------------------------------------------------------
    def on_put(self, size: int, elapsed_ms: int, ok: bool = True) -> None:
        if not ok:
            self.put_failed += 1
            return
        self.put_times += 1
        self.put_size += size
        self.put_max_ms = max(self.put_max_ms, elapsed_ms)
        # setPutMessageEntireTimeMax: <= 0, then < 10, < 50, ... < 10000, the rest
        i = 0 if elapsed_ms <= 0 else bisect.bisect_right(_BUCKET_LIMITS, elapsed_ms)
        self.put_buckets[i] += 1
        self.latency[bisect.bisect_left(_LATENCY_BOUNDS, elapsed_ms)] += 1  # ceilingEntry

    def on_get(self, found: int, elapsed_ms: int) -> None:
        if found:
            self.get_found += 1
            self.get_transferred += found
        else:
            self.get_miss += 1
        self.get_max_ms = max(self.get_max_ms, elapsed_ms)

    def add(self, name: str, key: str, value: int, times: int = 1) -> None:
        item = self.items.get((name, key))
        if item is None:  # sampled from the sampler's next tick on, as in RocketMQ
            item = self.items[(name, key)] = _Item()
        item.value += value
        item.times += times

    def total(self, name: str) -> int:
        return sum(item.value for (n, _), item in self.items.items() if n == name)

    # --- sampling (every second) -----------------------------------------------------
    def sample(self, force: bool = False) -> None:
        now = self.clock()
        self._samples.append(
            (now, self.put_times, self.get_found, self.get_miss, self.get_transferred)
        )
        if now > self._last_print + _PRINT_INTERVAL_MS:  # StoreStatsService.printTps
            self._last_print = now
            self.last_put_buckets, self.put_buckets = self.put_buckets, [0] * len(_BUCKET_NAMES)
            self.last_latency, self.latency = self.latency, [0] * len(_LATENCY_BOUNDS)
        # StatsItemSet's samplers: every 10 s, 10 min and hour from the broker's start
        if force or now - self._last_minute >= 10_000:
            self._last_minute = now
            for item in self.items.values():
                item.sample(item.minute, now, 10_000)
        if force or now - self._last_hour >= 600_000:
            self._last_hour = now
            for item in self.items.values():
                item.sample(item.hour, now, 600_000)
        if force or now - self._last_day >= 3_600_000:
            self._last_day = now
            for item in self.items.values():
                item.sample(item.day, now, 3_600_000)
        day = time.localtime(now / 1000).tm_yday
        if day != self._day:  # BrokerStats.record at midnight
            self._day = day
            self.put_yesterday_morning = self.put_today_morning
            self.get_yesterday_morning = self.get_today_morning
            self.put_today_morning = self.put_times
            self.get_today_morning = self.get_transferred

    def _tps(self, index: int, window: int) -> str:
        """StoreStatsService.getXxxTps(window): "" until enough samples exist."""
        if len(self._samples) <= window:
            return ""
        first, last = self._samples[-(window + 1)], self._samples[-1]
        span = last[0] - first[0]
        return repr(float((last[index] - first[index]) * 1000.0 / span)) if span else "0.0"

    def tps(self, index: int) -> str:
        return " ".join(self._tps(index, w) for w in (10, 60, 600))

    def total_get_tps(self) -> str:
        """getGetTotalTps: unlike the other rates, "0.0" (found + miss, both 0) while a
        window has too few samples."""
        parts = []
        for w in (10, 60, 600):
            if len(self._samples) <= w:
                parts.append("0.0")
                continue
            first, last = self._samples[-(w + 1)], self._samples[-1]
            span = last[0] - first[0]
            calls = (last[2] - first[2]) + (last[3] - first[3])
            parts.append(repr(calls * 1000.0 / span) if span else "0.0")
        return " ".join(parts)

    # --- reports ---------------------------------------------------------------------
    def runtime(self) -> str:
        seconds = max(0, (self.clock() - self.boot_ms) // 1000)
        days, rest = divmod(seconds, 86400)
        hours, rest = divmod(rest, 3600)
        minutes, secs = divmod(rest, 60)
        return f"[ {days} days, {hours} hours, {minutes} minutes, {secs} seconds ]"

    def store_info(self) -> dict[str, str]:
        """StoreStatsService.getRuntimeInfo."""
        times = self.put_times or 1
        return {
            "bootTimestamp": str(self.boot_ms),
            "runtime": self.runtime(),
            "putMessageEntireTimeMax": str(self.put_max_ms),
            "putMessageTimesTotal": str(times),
            "putMessageFailedTimes": str(self.put_failed),
            "putMessageSizeTotal": str(self.put_size),
            "putMessageDistributeTime": "null"
            if self.last_put_buckets is None
            else "".join(f"[{name}]:{n} " for name, n in zip(_BUCKET_NAMES, self.last_put_buckets)),
            "putMessageAverageSize": repr(self.put_size / float(times)),
            "dispatchMaxBuffer": "0",
            "getMessageEntireTimeMax": str(self.get_max_ms),
            "putTps": self.tps(1),
            "getFoundTps": self.tps(2),
            "getMissTps": self.tps(3),
            "getTotalTps": self.total_get_tps(),
            "getTransferedTps": self.tps(4),
            "putLatency99": f"{self._latency_px(0.99):.2f}",
            "putLatency999": f"{self._latency_px(0.999):.2f}",
        }

    def _latency_px(self, fraction: float) -> float:
        """StoreStatsService.findPutMessageEntireTimePX over the last minute's buckets:
        the px-th put's place, interpolated linearly inside its bucket."""
        index = int(sum(self.last_latency) * fraction)
        passed = 0
        for i, count in enumerate(self.last_latency):
            if index <= passed + count:
                low = _LATENCY_BOUNDS[i - 1] if i else 0
                if not count:
                    return float(low)
                return low + (_LATENCY_BOUNDS[i] - low) * (index - passed) / count
            passed += count
        return 0.0

    def view(self, name: str, key: str) -> dict[str, Any] | None:
        """VIEW_BROKER_STATS_DATA's BrokerStatsData, or None for a key never counted."""
        item = self.items.get((name, key))
        if item is None:
            return None
        return {
            label: _Item.window_stats(window)
            for label, window in (
                ("statsMinute", item.minute),
                ("statsHour", item.hour),
                ("statsDay", item.day),
            )
        }
