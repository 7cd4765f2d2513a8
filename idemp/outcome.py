"""What happened to one message, and what its runner must do about it.

Every decorated listener returns a :class:`Result` (or a :class:`BatchResult`); both carry
``consume_result``, so a runner reads them with :func:`idemp.message.ack_of` without
knowing which decorator, strategy or guard produced them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from idemp._fastinit import fast_frozen_init
from idemp.message import ConsumeResult, Message, ReconsumeLater

_ACK = ConsumeResult.SUCCESS
_RETRY = ConsumeResult.RECONSUME_LATER


class Outcome(Enum):
    """One message's fate. The value is the counter name used by :mod:`idemp.stats`."""

    PROCESSED = "processed"  # handler ran and its effect is recorded
    DUPLICATE = "duplicates"  # already CONSUMED: acked without running the handler
    IN_PROGRESS = "in_progress"  # someone else holds it (claim, lock): come back later
    PAYLOAD_CONFLICT = "payload_conflicts"  # same key, different body: reported, not run
    SKIPPED = "skipped"  # no business key and the policy says skip
    # handed to the dead-letter sink (no key), or (``Result.to_dlq``) to the runner for
    # the group's %DLQ% (a guarded transition held ``max_holds`` times)
    DEAD_LETTERED = "dead_lettered"
    DROPPED = "guard_drops"  # stale, duplicate or disallowed transition: never applied
    HELD = "held"  # ahead of its predecessor: come back later
    FAILED = "failures"  # handler raised (or declined): claim released, come back later
    STORE_ERROR = "store_errors"  # the dedup store failed: nothing decided, come back later

    @property
    def consume_result(self) -> ConsumeResult:
        return _RETRY if self in _RETRIED else _ACK

    @property
    def acked(self) -> bool:
        return self not in _RETRIED


# Everything that must bring the message back. A payload conflict is acked on purpose:
# retrying cannot change the stored body; it is counted and logged at ERROR instead.
_RETRIED = frozenset({Outcome.IN_PROGRESS, Outcome.HELD, Outcome.FAILED, Outcome.STORE_ERROR})


@fast_frozen_init
@dataclass(frozen=True, slots=True)
class Result:
    """A decorated listener's return value for one message."""

    outcome: Outcome
    message: Message
    key: str | None = None  # the namespaced business key, when one was extracted
    value: Any = None  # what the handler returned (PROCESSED only)
    error: BaseException | None = None
    takeover: bool = False  # the claim was taken over from a holder past its deadline
    detail: str = ""
    to_dlq: bool = False  # DEAD_LETTERED: the runner must put it in the group's %DLQ%
    retry: ReconsumeLater | None = None  # HELD: when to try again (``@guarded(hold_retry=)``)

    @property
    def consume_result(self) -> ConsumeResult:
        return ConsumeResult.DEAD_LETTER if self.to_dlq else self.outcome.consume_result


@dataclass(frozen=True, slots=True)
class BatchResult:
    """A batch listener's return value: one result per message, in delivery order.

    The batch is acked only if every message is; otherwise the whole batch comes back,
    and the messages already processed are then absorbed as duplicates.
    """

    results: Sequence[Result]

    @property
    def consume_result(self) -> ConsumeResult:
        # A batch is acked or retried whole: one message bound for the DLQ brings the
        # batch back, and the broker dead-letters that one after its maximum reconsumes.
        return _ACK if all(r.outcome.acked and not r.to_dlq for r in self.results) else _RETRY

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome is outcome)
