"""``within``: ``asyncio.wait_for`` without its lost cancellation, for the broker and the
client alike (no idemp imports: both layers use it)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(aw: Awaitable[T], timeout: float) -> T:
    """``asyncio.wait_for`` that never loses a cancellation.

    Before Python 3.12, ``wait_for`` returns the result instead of raising
    CancelledError when the awaited thing is already done but its wake-up has not run
    yet (gh-86296). A pull task cancelled in that window (a connection lookup just
    finished) carried on and sent its PULL, and the consumer's shutdown waited for it; a
    broker loop cancelled as its wake-up event was set waited again, and the broker's
    stop, which awaits its cancelled loops, with it.
    Raises ``asyncio.TimeoutError`` after ``timeout`` seconds, like ``wait_for``.
    """
    inner = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait((inner,), timeout=timeout)
    except asyncio.CancelledError:
        inner.cancel()
        raise
    if not done:
        inner.cancel()
        raise asyncio.TimeoutError
    return inner.result()
