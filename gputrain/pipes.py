"""A closed stdout (`gputrain predict RUN big.csv | head -1`): the command ends quietly, as a Unix tool
does, not with a BrokenPipeError traceback.

Python ignores SIGPIPE, so a write into a pipe whose reader has gone raises EPIPE wherever the command
was printing. The entry (gputrain.cli) catches it once for every command, points stdout at /dev/null
(the interpreter's own flush at exit would raise again, as "Exception ignored ... BrokenPipeError"; see
Python's docs, "Note on SIGPIPE") and exits 141: the status of a coreutils tool that SIGPIPE ended
(128 + 13), so `set -o pipefail` scripts see it as they see `yes | head -1`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys

STDOUT_CLOSED_EXIT = 128 + 13
"""128 + SIGPIPE: what a shell reports for a coreutils tool whose reader closed the pipe."""


def closed_stdout(err: BaseException) -> bool:
    """Whether `err` is a write into a stdout whose reader has gone (EPIPE; not a file's own error)."""
    return isinstance(err, OSError) and err.errno == errno.EPIPE and _stdout_is_pipe()


def _stdout_is_pipe() -> bool:
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def stdout_closed() -> int:
    """Point stdout at /dev/null (nothing more can reach the reader, and no later flush may raise);
    return the exit status, STDOUT_CLOSED_EXIT."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return STDOUT_CLOSED_EXIT
