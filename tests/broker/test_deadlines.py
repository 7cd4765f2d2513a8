"""The deadline index behind POP's revive and renew sweeps (pure logic)."""

from __future__ import annotations

import pytest

from idemp.broker.v5 import deadlines
from idemp.broker.v5.deadlines import Deadlines


def test_due_entries_come_out_earliest_first_and_stale_ones_never() -> None:
    held = {"a": 30, "b": 10, "c": 20}  # item -> its deadline now
    index: Deadlines[str] = Deadlines(lambda deadline, item: held.get(item) == deadline)
    for item, deadline in held.items():
        index.push(deadline, item)
    held["c"] = 25  # moved on: a new deadline, a new entry
    index.push(25, "c")
    del held["b"]  # acked
    assert index.pop_due(24) == []  # b's entry is stale, c's first one too
    assert index.pop_due(30) == [(25, "c"), (30, "a")]
    assert len(index) == 0


def test_pushing_while_working_through_due_entries_does_not_return_them_again() -> None:
    held = {"a": 5}
    index: Deadlines[str] = Deadlines(lambda deadline, item: held.get(item) == deadline)
    index.push(5, "a")
    due = index.pop_due(100)
    held["a"] = 6
    index.push(6, "a")  # renewed inside the sweep, still due by 100
    assert due == [(5, "a")]
    assert index.pop_due(100) == [(6, "a")]


def test_stale_entries_are_compacted_when_the_heap_doubles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadlines, "MIN_COMPACT", 4)
    held: dict[int, int] = {}
    index: Deadlines[int] = Deadlines(lambda deadline, item: held.get(item) == deadline)
    for item in range(100):  # each acked before the next is pushed, deadlines far off
        held = {item: 1_000_000}
        index.push(1_000_000, item)
    assert len(index) <= 5  # not 100: stale entries went at each compaction
    assert index.pop_due(1_000_000) == [(1_000_000, 99)]
