"""Counters, structured log lines and (if ``prometheus-client`` is installed) metrics.

Counters are per listener and cheap (a dict under a lock): the pipeline bumps one per
message on the hot path. ``stats()`` returns a snapshot; ``reset()`` is for tests.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import Any

logger = logging.getLogger("idemp")

#: Every counter name, in reporting order. ``takeovers``, ``reordered`` and
#: ``commit_errors`` are counted besides the outcome (a taken-over message is also
#: ``processed``; ``reordered``: a ``@guarded`` transition first held, then applied in
#: its own batch after a later message of the batch applied its predecessor).
COUNTERS = (
    "processed",
    "duplicates",
    "in_progress",
    "takeovers",
    "payload_conflicts",
    "guard_drops",
    "held",
    "reordered",
    "skipped",
    "dead_lettered",
    "failures",
    "store_errors",
    "commit_errors",
)

_lock = threading.Lock()
_counts: defaultdict[tuple[str, str], int] = defaultdict(int)

try:  # optional: only when the application installed prometheus-client
    from prometheus_client import Counter as _PromCounter

    _prom: Any = _PromCounter(
        "idemp_events", "idemp per-message events by listener", ["listener", "event"]
    )
except ImportError:  # pragma: no cover - depends on the environment
    _prom = None


_children: dict[tuple[str, str], Any] = {}  # labelled Prometheus counters, looked up once


def incr(listener: str, event: str, n: int = 1) -> None:
    key = (listener, event)
    with _lock:
        _counts[key] += n
    if _prom is not None:
        child = _children.get(key)
        if child is None:  # two threads may both look it up: labels() gives the same one
            child = _children[key] = _prom.labels(listener, event)
        child.inc(n)


def stats(listener: str | None = None) -> dict[str, int]:
    """Counter totals, for one listener or summed over all; every counter is present."""
    out = dict.fromkeys(COUNTERS, 0)
    with _lock:
        for (name, event), value in _counts.items():
            if listener is None or name == listener:
                out[event] = out.get(event, 0) + value
    return out


def listeners() -> list[str]:
    with _lock:
        return sorted({name for name, _ in _counts})


def reset() -> None:
    with _lock:
        _counts.clear()


def log_event(level: int, event: str, *, exc: BaseException | None = None, **fields: Any) -> None:
    """One line, ``idemp event=<event> k=v ...``, plus the fields as ``extra['idemp']``
    for JSON formatters. Formatted only when the level is enabled."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and v != "")
    logger.log(
        level,
        "idemp event=%s %s",
        event,
        text,
        exc_info=exc,
        extra={"idemp": {"event": event, **fields}},
    )
