"""Ranks die with their launcher.

torchrun starts each rank in a session of its own, so when the launcher itself is killed outright
(SIGKILL, the OOM killer) nothing reaches the ranks: they would train on unattended, writing into
the run directory that a restarted job is about to use. A rank started by `gputrain train
--nproc-per-node` therefore asks the kernel to SIGKILL it when its parent dies (Linux's
PR_SET_PDEATHSIG). Other launchers and other systems are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

LAUNCHER_ENV = "GPUTRAIN_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def die_with_launcher() -> None:
    """In a rank: be killed when the gputrain launcher that started us goes away."""
    launcher = os.environ.get(LAUNCHER_ENV)
    if not sys.platform.startswith("linux") or not launcher or not launcher.isdigit():
        return
    if os.getppid() != int(launcher):
        return  # started by something else (e.g. a torchrun the user ran): not ours to tie
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != int(launcher):  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
