"""One logger for the package: rank prefix when distributed, rank 0 only by default."""

from __future__ import annotations

import logging
import os
import sys

from gputrain.terminal import printable

_CONFIGURED = False


class _Printable(logging.Formatter):
    """Log lines as characters: a name or value from a file never reaches the terminal as a control
    sequence (gputrain/terminal.py)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def setup_logging(rank: int = 0, world_size: int = 1, all_ranks: bool = False) -> logging.Logger:
    global _CONFIGURED
    log = logging.getLogger("gputrain")
    if not _CONFIGURED:
        handler = logging.StreamHandler(sys.stderr)
        prefix = f"[rank{rank}] " if world_size > 1 else ""
        handler.setFormatter(_Printable(f"{prefix}%(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        _CONFIGURED = True
    quiet = rank != 0 and not all_ranks and os.environ.get("GPUTRAIN_LOG_ALL_RANKS") != "1"
    log.setLevel(logging.ERROR if quiet else logging.INFO)
    return log
