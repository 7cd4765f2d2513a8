"""Adapter for idemp's own runners (``idemp.runners.ConcurrentRunner``/``OrderlyRunner``).

Their listener contract is already idemp's: a callable taking an ``idemp.Message``, its
result read with ``ack_of``, raising = reconsume later. What this adds is small: the
consumer group bound into each message (so ``@idempotent``'s default namespace is
``<group>/<topic>`` even for messages built elsewhere), a result always reduced to a
``ConsumeResult`` (an unexpected return value means reconsume later, logged), and
``concurrent``/``orderly`` helpers that build the runner with the wrapped listener.

    runner = concurrent(handle_order, group="orders", namesrv_addr="127.0.0.1:9876")
    runner.subscribe("Orders"); runner.start()

A batch form is not offered: both runners call their listener one message at a time
(``consume_batch_size`` only groups the thread hop), so ``@idempotent.batch`` has no
runner hook to receive a list yet.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from idemp.message import ConsumeResult, Message, consume_result_of

logger = logging.getLogger("idemp.adapters.runner")

Listener = Callable[[Message], Any]


def listener(fn: Listener, *, group: str | None = None) -> Callable[[Message], ConsumeResult]:
    """Wrap ``fn`` for a runner: bind ``group`` where a message has none, read the result
    with ``consume_result_of``; an exception or an unreadable result → RECONSUME_LATER."""

    def consume(message: Message) -> ConsumeResult:
        if group is not None and message.consumer_group is None:
            message = dataclasses.replace(message, consumer_group=group)
        try:
            return consume_result_of(fn(message))  # DEAD_LETTER stays DEAD_LETTER
        except Exception:
            logger.exception("listener failed on %s: reconsume later", message.msg_id)
            return ConsumeResult.RECONSUME_LATER

    consume.__wrapped__ = fn  # type: ignore[attr-defined]
    return consume


def concurrent(fn: Listener, *, group: str, **runner_options: Any) -> Any:
    """A ``ConcurrentRunner`` for ``fn`` in consumer group ``group``."""
    from idemp.runners import ConcurrentRunner  # the runners pull in the client

    return ConcurrentRunner(listener(fn, group=group), group=group, **runner_options)


def orderly(fn: Listener, *, group: str, **runner_options: Any) -> Any:
    """An ``OrderlyRunner`` for ``fn`` in consumer group ``group``."""
    from idemp.runners import OrderlyRunner

    return OrderlyRunner(listener(fn, group=group), group=group, **runner_options)
