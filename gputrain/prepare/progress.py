"""The progress bar of `gputrain prepare` on stderr: source bytes read, tokens written, the rate and
what is left. Shown where stderr is a terminal and not --quiet (as train's bar: never in a log file)."""

from __future__ import annotations

import sys
from typing import Any


class PrepareProgress:
    """A rich bar over the corpus's bytes, or nothing (module docstring)."""

    def __init__(self, total_bytes: int, done_bytes: int, *, quiet: bool) -> None:
        self._bar: Any = None
        self._shown = not quiet and sys.stderr.isatty()
        self._total, self._done = total_bytes, done_bytes

    def _start(self) -> None:
        """The bar, at the first progress: its refresh thread starts after the pool's workers are forked."""
        self._shown = False
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._bar = Progress(
            TextColumn("prepare"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TextColumn("{task.fields[tokens]:,} tokens"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._bar.add_task("prepare", total=max(self._total, 1), completed=self._done, tokens=0)
        self._bar.start()

    def advance(self, source_bytes: int, tokens: int) -> None:
        if self._shown:
            self._start()
        if self._bar is not None:
            self._bar.update(self._task, advance=source_bytes, tokens=tokens)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
