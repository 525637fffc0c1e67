"""One run at a time in a run directory.

Two runs started into the same directory (a second terminal, a scheduler that retries a job still
running) each resumed from the other's checkpoints and wrote their metrics, checkpoints, weights and
summary over each other's, both exiting 0. While a run trains, its process holds an exclusive lock
on the directory itself (flock, taken by rank 0): no file is added, and the kernel drops the lock
when the process ends, however it ends (SIGKILL included), so a crashed run never leaves a stale
lock behind. A second run is refused before it reads or writes anything there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from gputrain.distributed.context import DistContext, agree_on_text
from gputrain.errors import UsageError
from gputrain.run.files import run_dir_option


@contextlib.contextmanager
def run_dir_locked(run_dir: Path, job: DistContext) -> Iterator[None]:
    """Hold `run_dir` for this run (the build made it: `claim_run_dir`).

    Raises:
        UsageError: another run is training in `run_dir` now (on every rank of the job).
    """
    fd, refusal = None, ""
    if job.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            fd = None
            refusal = (
                f"{run_dir} is in use: another run is training in it now; wait for it to end, or choose "
                f"another {run_dir_option()} for a new run"
            )
    refusal = agree_on_text(refusal, job)
    try:
        if refusal:
            raise UsageError(refusal)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # the lock goes with the descriptor
