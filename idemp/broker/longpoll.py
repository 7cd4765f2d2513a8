"""Long polling: a PULL that finds nothing new is held, not answered.

It is re-run as soon as a matching message lands in its queue, or when its suspend
time is up; a re-run never suspends again. An idle consumer therefore costs one
parked request per queue and no CPU. As RocketMQ's PullRequestHoldService, a check
every 5 s (shortPollingTimeMills without long polling) also re-runs each held pull whose
queue has grown past it, matching or not, so a consumer of some tags moves its offset
past the others' messages within that time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False)
class HeldPull:
    topic: str
    queue_id: int
    offset: int
    codes: frozenset[int] | None
    rerun: Callable[[], None]
    owner: object | None = field(default=None, repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    done: bool = False


class PullHoldService:
    def __init__(self, max_offset: Callable[[str, int], int] | None = None) -> None:
        self._held: dict[tuple[str, int], list[HeldPull]] = {}
        self.max_offset = max_offset

    def hold(self, pull: HeldPull, timeout_ms: int) -> None:
        key = (pull.topic, pull.queue_id)
        self._held.setdefault(key, []).append(pull)
        loop = asyncio.get_running_loop()
        pull.timer = loop.call_later(timeout_ms / 1000, self._expire, pull)

    def _finish(self, pull: HeldPull) -> None:
        if pull.done:
            return
        pull.done = True
        if pull.timer is not None:
            pull.timer.cancel()
        held = self._held.get((pull.topic, pull.queue_id))
        if held is not None:
            try:
                held.remove(pull)
            except ValueError:
                pass
            if not held:
                del self._held[(pull.topic, pull.queue_id)]
        pull.rerun()

    def _expire(self, pull: HeldPull) -> None:
        self._finish(pull)

    def arrived(self, topic: str, queue_id: int, max_offset: int, tags_code: int) -> None:
        held = self._held.get((topic, queue_id))
        if not held:
            return
        for pull in list(held):
            if max_offset > pull.offset and (pull.codes is None or tags_code in pull.codes):
                self._finish(pull)

    def check(self) -> None:
        """checkHoldRequest: re-run every held pull its queue has grown past (the store's
        max offset; no tag is known here, and RocketMQ counts that as a match)."""
        if self.max_offset is None:
            return
        for (topic, queue_id), held in list(self._held.items()):
            newest = self.max_offset(topic, queue_id)
            for pull in list(held):
                if newest > pull.offset:
                    self._finish(pull)

    async def run(self, period_s: Callable[[], float]) -> None:
        while True:
            await asyncio.sleep(period_s())
            self.check()

    def cancel_where(self, predicate: Callable[[HeldPull], bool]) -> None:
        """Drop held pulls (e.g. of a closed connection) without answering them."""
        for key, held in list(self._held.items()):
            keep = []
            for pull in held:
                if predicate(pull):
                    pull.done = True
                    if pull.timer is not None:
                        pull.timer.cancel()
                else:
                    keep.append(pull)
            if keep:
                self._held[key] = keep
            else:
                del self._held[key]

    def wake_all(self) -> None:
        for held in list(self._held.values()):
            for pull in list(held):
                self._finish(pull)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self._held.values())
