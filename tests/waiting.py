"""Waiting for another process to reach a point it shows on disk (a log line, a file), by polling.

The poll's short sleep only paces the checks: the wait ends on the condition, never on a time,
and the deadline only stops a test that would otherwise hang (generous, for a loaded machine).
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.005
DEADLINE_S = 300.0


def wait_until(condition: Callable[[], bool], timeout_s: float = DEADLINE_S, what: str = "the condition",
               poll_s: float = POLL_S) -> None:
    """Return once `condition()` is true; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(poll_s)
