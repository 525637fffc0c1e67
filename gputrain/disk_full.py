"""A write that fails leaves no partial file behind, and a full disk (or another file-system failure:
read-only, out of inodes, a file made immutable; run/fs_errors.py) is said as such.

A checkpoint, the final weights or any file of the run written onto a disk that fills up fail midway (safetensors says
"No space left on device (os error 28)", torch's zip writer only "unexpected pos"). The partial
files would keep the disk full, so the run's own record (summary.json, error.log: a few KiB) could
not be written either and the run would end with no summary. They are removed at once, and the
failure becomes one line that says what could not be written where, and how much space was left.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from gputrain.errors import GputrainError, RunError
from gputrain.run.fs_errors import error_code, reason

NEARLY_FULL = 1 << 20
"""Free bytes below which a failed write is taken for a full disk whatever its error says (torch's
zip writer reports a short write only as "unexpected pos")."""


class FileSystemFailure(RunError, OSError):
    """A run's file could not be written for what its file system is (read-only, a file made
    immutable, no permission): one line (run/fs_errors.py), and an OSError with the errno still."""


class DiskFull(RunError, OSError):
    """The disk under the run directory filled up while a run's file was written. An OSError too:
    what suppresses a failed write (the record of a run that failed) suppresses this one."""


@contextlib.contextmanager
def removed_if_failed(partial: Path, what: str) -> Iterator[None]:
    """Around writing `partial` (a file or a directory): on failure it is removed, and a full disk
    raises DiskFull naming `what` ("the checkpoint of step 40")."""
    try:
        yield
    except BaseException as exc:
        free = _free_bytes(partial.parent)
        with contextlib.suppress(OSError):  # a read-only file system refuses the removal too: not a second error
            if partial.is_dir():
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)
        if isinstance(exc, Exception) and _no_space(exc, free):
            left = f"{free / 2**20:,.1f} MiB" if free is not None else "none"
            inodes = _no_inode(partial.parent)
            lacking, left, fix = (
                ("free inodes (no new file can be made)", f"{left} free, no inode", "remove files")
                if inodes
                else ("space", f"{left} free", "free some space")
            )
            raise DiskFull(
                f"no {lacking} left on the device for {what} in {partial.parent} ({left}); its partial files "
                f"are removed: {fix} and run again (a resume continues from the last complete checkpoint)"
            ) from exc
        if isinstance(exc, Exception) and not isinstance(exc, GputrainError):
            line = reason(exc, partial.parent)  # an OSError, or a writer's own error naming one (safetensors')
            if line is not None:  # read-only, not permitted, no permission, a loop of links
                failure = FileSystemFailure(f"{what} could not be written in {partial.parent}: {line}")
                failure.errno = error_code(exc)
                raise failure from exc
        raise


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _no_inode(folder: Path) -> bool:
    """Whether the file system holds no free inode (a full disk that `df -h` shows with space free)."""
    try:
        stats = os.statvfs(folder)
    except OSError:
        return False
    return stats.f_files > 0 and stats.f_favail == 0


def _no_space(exc: BaseException, free: int | None) -> bool:
    for cause in (exc, exc.__cause__, exc.__context__):
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if cause is not None and ("No space left on device" in str(cause) or "os error 28" in str(cause)):
            return True
    return free is not None and free < NEARLY_FULL
