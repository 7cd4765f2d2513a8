"""The soak run, short: the judging rules on planted windows, and one real minute.

The real run checks what a short run can check exactly (every key applied once, in
order; windows sampled from live processes). Flat memory and latency are judged by
``make soak`` over 30 minutes, where they mean something; a minute of warm-up noise
would only make a flaky test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.soak import FD_BOUND, INDEX_BYTES, RSS_BOUND_MB, duplicated, judge, run

pytestmark = pytest.mark.timeout(600)


def _windows(n: int, **grow: float) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        w: dict[str, Any] = {
            "t": 100.0 + 10 * i,
            "broker_rss_mb": 30.0,
            "consumer_rss_mb": 80.0,
            "broker_fds": 20,
            "consumer_fds": 28,
            "p99": 40.0,
            "load1": 0.5,
            "stored": 1000 * i,
        }
        for name, per_window in grow.items():
            w[name] = w[name] + per_window * i
        out.append(w)
    return out


def test_flat_run_passes_and_warmup_is_excluded() -> None:
    windows = _windows(30)
    windows[0]["consumer_rss_mb"] = 10.0  # during the warm-up: not judged
    judged, failures = judge(windows, warmup_s=5.0, started=100.0, max_load=4.0)
    assert failures == []
    assert judged["consumer_rss_mb"] == {"first": 80.0, "last": 80.0, "bound": 80.0 + RSS_BOUND_MB}
    # 29 steady windows: thirds of 9; stored medians 5,000 and 25,000 messages apart by
    # 20,000 → the broker's index allowance is 20,000 × 28 bytes.
    assert judged["broker_rss_mb"]["bound"] == 30.0 + RSS_BOUND_MB + 20_000 * INDEX_BYTES / 2**20
    assert judged["p99_ms"]["bound"] == 2 * 40.0 + 25.0


@pytest.mark.parametrize(
    ("name", "per_window", "needle"),
    [
        ("consumer_rss_mb", 1.0, "consumer_rss_mb grew"),
        ("broker_rss_mb", 1.0, "broker_rss_mb grew"),
        ("broker_fds", 0.5, "broker_fds grew"),
        ("p99", 10.0, "p99 latency rose"),
    ],
)
def test_growth_is_reported(name: str, per_window: float, needle: str) -> None:
    judged, failures = judge(
        _windows(30, **{name: per_window}), warmup_s=0.0, started=100.0, max_load=4.0
    )
    assert len(failures) == 1
    assert failures[0].startswith(needle)


def test_fd_growth_within_bound_passes() -> None:
    windows = _windows(30)
    for w in windows[-10:]:
        w["consumer_fds"] += FD_BOUND
    assert judge(windows, warmup_s=0.0, started=100.0, max_load=4.0)[1] == []


def test_broker_index_growth_is_allowed_and_more_is_not() -> None:
    windows = _windows(30)
    for w in windows:  # exactly the index: 28 bytes per stored message
        w["broker_rss_mb"] += w["stored"] * INDEX_BYTES / 2**20
    assert judge(windows, warmup_s=0.0, started=100.0, max_load=4.0)[1] == []
    for w in windows[-10:]:
        w["broker_rss_mb"] += RSS_BOUND_MB + 1
    assert judge(windows, warmup_s=0.0, started=100.0, max_load=4.0)[1][0].startswith(
        "broker_rss_mb grew"
    )


def test_latency_of_oversubscribed_windows_is_not_judged() -> None:
    windows = _windows(30)
    for w in windows[20:25]:  # a burst of someone else's work
        w["load1"], w["p99"] = 12.0, 900.0
    judged, failures = judge(windows, warmup_s=0.0, started=100.0, max_load=4.0)
    assert failures == []
    assert judged["p99_ms"]["last"] == 40.0
    for w in windows:
        w["load1"] = 12.0
    judged, failures = judge(windows, warmup_s=0.0, started=100.0, max_load=4.0)
    assert "p99_ms" not in judged
    assert failures == [
        "p99 latency not judged: the machine's 1-minute load was above 4 in "
        "10 of 10 windows of the first third and 10 of 10 of the last"
    ]


def test_too_few_windows_is_a_failure_not_a_pass() -> None:
    assert judge(_windows(2), warmup_s=0.0, started=100.0, max_load=4.0)[1] == [
        "only 2 windows after the warm-up: too short to judge"
    ]


def test_one_real_minute_applies_every_key_once_and_in_order(tmp_path: Path) -> None:
    figures = run(1.0, rate=100.0, workdir=tmp_path, window_s=5.0, warmup_s=15.0, say=print)
    print(figures.line())
    assert figures.drained
    assert min(figures.sent_by_topic.values()) > 0
    assert figures.duplicates_sent == sum(
        duplicated(i) for n in figures.sent_by_topic.values() for i in range(n)
    )
    assert figures.effects == figures.sent
    assert (figures.doubled, figures.lost, figures.order_violations) == (0, 0, 0)
    assert len(figures.windows) >= 8  # 60 s in 5 s windows, minus the consumer's start
    assert all(w["consumer_rss_mb"] > 0 and w["broker_rss_mb"] > 0 for w in figures.windows)
    assert all(w["consumer_fds"] > 0 and w["broker_fds"] > 0 for w in figures.windows)
