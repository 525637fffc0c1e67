"""Text bound for a terminal shown as characters, never as control sequences.

Messages and log lines carry what users and files supplied: a run directory's name, a path, a
field of a hand-edited run file. A name holding ESC [ ... could recolour, clear or retitle the
user's terminal, or hide the rest of the line; a bidirectional override could show a name other
than the one on disk. Every such character is written as its escape (`\\x1b`, `\\u202e`), as
Python's repr would; newlines and tabs stay, as messages lay themselves out with them.
"""

from __future__ import annotations

import re

_UNSHOWABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control and direction-changing character shown as its escape."""
    return _UNSHOWABLE.sub(_escape, text)
