"""One run at a time in a run directory.

Two runs started into the same directory (a second terminal, a scheduler that retries a job still
running) each resumed from the other's checkpoints and wrote their metrics, checkpoints, weights and
summary over each other's, both exiting 0. While a run trains, its process holds an exclusive lock
on the directory itself (flock, taken by rank 0): no file is added, and the kernel drops the lock
when the process ends, however it ends (SIGKILL included), so a crashed run never leaves a stale
lock behind. A second run is refused before it reads or writes anything there, told which process
holds the directory where the system says (Linux's /proc/locks).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
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
            holder = lock_holder(fd)
            os.close(fd)
            fd = None
            refusal = (
                f"{run_dir} is in use: another run is training in it now{f' ({holder})' if holder else ''}; wait "
                f"for it to end, or choose another {run_dir_option()} for a new run"
            )
    refusal = agree_on_text(refusal, job)
    try:
        if refusal:
            raise UsageError(refusal)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # the lock goes with the descriptor


LOCKS = Path("/proc/locks")
"""The kernel's table of file locks (Linux): `N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF`."""
_COMMAND = re.compile(r"[a-z][a-z-]{0,30}")


def lock_holder(fd: int, locks: Path = LOCKS) -> str | None:
    """Who holds the flock on the directory open as `fd`: "process PID (gputrain rl)", or None where
    the system does not say (no /proc/locks, another PID namespace)."""
    st = os.fstat(fd)
    file_id = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        table = locks.read_text()
    except OSError:
        return None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == file_id and fields[4].isdigit():
            pid = int(fields[4])
            if pid > 0:
                command = _command_of(pid)
                return f"process {pid}" + (f", {command}" if command else "")
    return None


def _command_of(pid: int) -> str | None:
    """`gputrain <command>` where the process runs one (its own command line says), else None."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for word, after in itertools.pairwise(argv):
        if (word == "gputrain" or word.endswith("/gputrain")) and _COMMAND.fullmatch(after):
            return f"gputrain {after}"
    return None
