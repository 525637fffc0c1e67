"""A write that fails leaves no partial file behind, and a full disk is said as such.

A checkpoint, the final weights or any file of the run written onto a disk that fills up fail midway (safetensors says
"No space left on device (os error 28)", torch's zip writer only "unexpected pos"). The partial
files would keep the disk full, so the run's own record (summary.json, error.log: a few KiB) could
not be written either and the run would end with no summary. They are removed at once, and the
failure becomes one line that says what could not be written where, and how much space was left.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator
from pathlib import Path

from gputrain.errors import RunError

NEARLY_FULL = 1 << 20
"""Free bytes below which a failed write is taken for a full disk whatever its error says (torch's
zip writer reports a short write only as "unexpected pos")."""


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
        if partial.is_dir():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
        if isinstance(exc, Exception) and _no_space(exc, free):
            left = f"{free / 2**20:,.1f} MiB" if free is not None else "none"
            raise DiskFull(
                f"no space left on the device for {what} in {partial.parent} ({left} free); its partial files "
                "are removed: free some space and run again (a resume continues from the last complete checkpoint)"
            ) from exc
        raise


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _no_space(exc: BaseException, free: int | None) -> bool:
    for cause in (exc, exc.__cause__, exc.__context__):
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if cause is not None and ("No space left on device" in str(cause) or "os error 28" in str(cause)):
            return True
    return free is not None and free < NEARLY_FULL
