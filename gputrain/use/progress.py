"""Progress of a long generation on stderr: a line at most every PROGRESS_S seconds, and one at the
end, for generations of at least LONG_GENERATION tokens (a short one ends before a line would help).

A line: `generate: 1,200/100,000 new tokens, 240 tokens/s`. The clock is a parameter, so a test
counts the lines of a simulated run instead of waiting.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

PROGRESS_S = 5.0
"""Seconds between progress lines at most."""
LONG_GENERATION = 1_000
"""New tokens from which progress is shown."""


class TokenProgress:
    """Counts a generation's tokens and prints its progress (module docstring)."""

    def __init__(self, total: int, *, file: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.file = file if file is not None else sys.stderr
        self.clock = clock
        self.shown = total >= LONG_GENERATION
        self.start = clock()
        self.next_line = self.start + PROGRESS_S
        self.done = 0

    def step(self) -> None:
        """One more token (per sample) drawn."""
        self.done += 1
        if self.shown and self.done < self.total and self.clock() >= self.next_line:
            self.next_line = self.clock() + PROGRESS_S
            self._line()

    def end(self) -> None:
        if self.shown:
            self._line(" (done)")

    def _line(self, note: str = "") -> None:
        elapsed = self.clock() - self.start
        rate = f", {self.done / elapsed:,.0f} tokens/s" if elapsed > 0 else ""
        self.file.write(f"generate: {self.done:,}/{self.total:,} new tokens{rate}{note}\n")
        self.file.flush()
