"""Text bound for a terminal shown as characters, never as control sequences.

Messages and log lines carry what users and files supplied: a run directory's name, a path, a
field of a hand-edited run file. A name holding ESC [ ... could recolour, clear or retitle the
user's terminal, or hide the rest of the line; a bidirectional override could show a name other
than the one on disk. Every such character is written as its escape (`\\x1b`, `\\u202e`), as
Python's repr would; newlines and tabs stay, as messages lay themselves out with them.

`rich_console` is the console the commands print tables and lines with: wrapped to the terminal's
width in a terminal, unwrapped where the output goes to a file or a pipe.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console

UNWRAPPED_WIDTH = 10_000
"""The width rich lays out to off a terminal: wide enough that no line of ours is wrapped."""

_UNSHOWABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control and direction-changing character shown as its escape."""
    return _UNSHOWABLE.sub(_escape, text)


def rich_console(file: TextIO | None = None) -> Console:
    """A rich console on `file` (stdout). Off a terminal rich would wrap every line at 80 columns
    (it cannot measure a file), which splits a log line or a path in a file or a CI log; there it
    lays out to UNWRAPPED_WIDTH instead, unless COLUMNS says a width (rich reads it itself)."""
    from rich.console import Console

    out = file if file is not None else sys.stdout
    isatty = getattr(out, "isatty", None)
    terminal = bool(isatty()) if callable(isatty) else False
    width = None if terminal or os.environ.get("COLUMNS", "").isdigit() else UNWRAPPED_WIDTH
    return Console(file=out, highlight=False, width=width)
