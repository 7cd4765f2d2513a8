"""A small progress bar on stderr: redrawn in place on a terminal, a few plain lines
(every 25 %) otherwise, so logs of CI runs stay short."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Bar:
    def __init__(self, label: str, total: int, *, stream: TextIO | None = None) -> None:
        self.label, self.total = label, max(1, total)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.value = 0
        self._last_draw = 0.0
        self._quarter = -1

    def update(self, value: int) -> None:
        self.value = value
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw >= 0.1 or value >= self.total:
                self._last_draw = now
                self._draw("\r")
        else:
            quarter = min(4, value * 4 // self.total)
            if quarter > self._quarter:
                self._quarter = quarter
                self._draw("")

    def _draw(self, prefix: str) -> None:
        frac = min(1.0, self.value / self.total)
        filled = int(frac * 30)
        bar = "#" * filled + "." * (30 - filled)
        secs = time.monotonic() - self.started
        end = "" if self.tty else "\n"
        self.stream.write(
            f"{prefix}  {self.label:<10} [{bar}] {self.value:>7}/{self.total} "
            f"{frac:4.0%} {secs:5.1f}s{end}"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self._draw("\r")
            self.stream.write("\n")
        elif self._quarter < 4:
            self._draw("")
        self.stream.flush()
