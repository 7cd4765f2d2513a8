"""The POP state's journal: what 5.x receives left invisible, kept across a restart.

RocketMQ 5.3.3 writes a receive's checkpoint and each ack into its revive topic, so after
a restart an unacked message comes back when its invisible time ends (one attempt more),
and a handle from before the restart still acks or changes its message. idemp keeps the
same state in memory and writes each change here, one JSON line per thing changed (an
in-flight message, a queue's position, a FIFO queue's state): the last line about a
thing is its state. Lines go to the file when a request's changes are done (no fsync:
they survive the process, as the commit log's pages do). At start the file is read, then
rewritten with only what is still live, and again whenever it has grown well past that.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("idemp.broker.v5")

Record = list[Any]  # [kind, *identity, *state]; kind "e"/"x", "q", "o" or "g"
# how many fields name the thing a record is about, by its kind
_IDENTITY = {"e": 6, "x": 6, "q": 5, "o": 4, "g": 2}
REWRITE_EVERY = 10_000  # lines appended between checks of the file's size against the live


_quoted = functools.lru_cache(maxsize=4096)(json.dumps)


def _key(record: Record) -> tuple[Any, ...]:
    kind = "e" if record[0] == "x" else record[0]
    return (kind, *record[1 : _IDENTITY[record[0]]])


def replay(lines: Iterable[str]) -> list[Record]:
    """The live records of a journal's lines, in the order they were last written: an
    ``x`` removes its message's ``e``, a ``g`` everything of its group. A line cut short
    by a crash (the last one) is skipped."""
    live: dict[tuple[Any, ...], Record] = {}
    for line in lines:
        try:
            record = json.loads(line)
            kind = record[0]
            key = _key(record)
        except (ValueError, IndexError, KeyError, TypeError):
            continue
        if kind == "x":
            live.pop(key, None)
        elif kind == "g":
            for other in [k for k in live if k[1] == record[1]]:
                del live[other]
        else:
            live.pop(key, None)  # re-inserted last: the dict keeps the latest order
            live[key] = record
    return list(live.values())


class PopJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._pending: list[str] = []
        self._fd: int | None = None
        self.lines = 0
        self._check_at = REWRITE_EVERY
        self._failed = False

    def load(self) -> list[Record]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return replay(text.splitlines())

    def add(self, record: Record) -> None:
        self._pending.append(json.dumps(record, separators=(",", ":")))

    # The two lines of every message received and acked, written as json.dumps would
    # write them at a third of its cost (the names quoted once each)
    def in_flight(
        self, group: str, topic: str, stored: str, qid: int, offset: int, fields: list[Any]
    ) -> None:
        start, pop_time, invisible, topic_type, log_offset, reconsume, deadline = fields
        self._pending.append(
            f'["e",{_quoted(group)},{_quoted(topic)},{_quoted(stored)},{qid},{offset},'
            f"{start},{pop_time},{invisible},{_quoted(topic_type)},{log_offset},{reconsume},"
            f"{deadline}]"
        )

    def settled(self, group: str, topic: str, stored: str, qid: int, offset: int) -> None:
        self._pending.append(
            f'["x",{_quoted(group)},{_quoted(topic)},{_quoted(stored)},{qid},{offset}]'
        )

    def flush(self) -> None:
        if not self._pending:
            return
        data = ("\n".join(self._pending) + "\n").encode()
        self.lines += len(self._pending)
        self._pending.clear()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, data)
            self._failed = False
        except OSError as exc:  # a full disk: the state in memory stays right
            if not self._failed:
                log.error("v5: cannot write the POP journal %s: %s", self.path, exc)
            self._failed = True

    def due_for_rewrite(self) -> bool:
        """Whether to count the live records now (every REWRITE_EVERY lines appended)."""
        return self.lines >= self._check_at

    def rewrite(self, records: Iterable[Record]) -> None:
        """Replace the file by ``records`` (written beside it, then renamed over it)."""
        self._pending.clear()
        tmp = self.path.with_suffix(".tmp")
        count = 0
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                for record in records:
                    out.write(json.dumps(record, separators=(",", ":")) + "\n")
                    count += 1
            os.replace(tmp, self.path)
        except OSError as exc:
            log.error("v5: cannot rewrite the POP journal %s: %s", self.path, exc)
            return
        self.close()
        self.lines = count
        self._check_at = count + REWRITE_EVERY

    def postpone(self) -> None:
        self._check_at = self.lines + REWRITE_EVERY

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
