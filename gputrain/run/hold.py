"""Test hook: hold a run at a named point until a signal has reached it, so a test can interrupt a
run at a known moment (during a checkpoint, the final save, the last evaluation) with a real signal
and no sleep as synchronisation.

    GPUTRAIN_TEST_HOLD_AT=final-save GPUTRAIN_TEST_HOLD_MARK=/tmp/x.held gputrain train ...

The points: `checkpoint` (a save, before it writes), `val` and `test` (an evaluation, before it
runs) and `final-save` (before model.safetensors is written). At the point named (`<point>` or
`<point>:<step>`), each rank appends its rank to the mark file and waits until its own stop request
has taken the signal the test then sends (a SIGKILL ends it there). Unset in normal use: the check
is one dictionary lookup.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

AT = "GPUTRAIN_TEST_HOLD_AT"
MARK = "GPUTRAIN_TEST_HOLD_MARK"


def hold(point: str, step: int, stopped: Callable[[], bool], rank: int = 0) -> None:
    """At `point` of `step`, when the environment names it: mark, then wait for `stopped()`."""
    at = os.environ.get(AT)
    if not at or at not in (point, f"{point}:{step}"):
        return
    with Path(os.environ[MARK]).open("a") as mark:
        mark.write(f"{rank}\n")
    while not stopped():
        time.sleep(0.01)  # the signal's handler runs between these waits
