"""Whether a folder takes new files, asked without leaving anything behind.

The check runs before any work (a read-only or virtual file system, no permission: said at once).
A named probe file created and removed again leaves itself behind when a signal or a kill lands
between the two; on Linux the probe is an unnamed file (O_TMPFILE), which never appears in the folder
and is gone when its descriptor closes, however the process ends.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

_NO_TMPFILE = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT)
"""What a file system (or a kernel) without O_TMPFILE answers: then a named probe is asked."""


def check_takes_files(folder: Path) -> None:
    """Raise the OSError a new file in `folder` would meet (EROFS, EACCES, ENOSPC, ...); None if it
    takes one. Nothing is left in `folder` on Linux whatever ends the process meanwhile."""
    tmpfile = getattr(os, "O_TMPFILE", None)
    if tmpfile is not None:
        try:
            fd = os.open(folder, tmpfile | os.O_WRONLY, 0o600)
        except OSError as err:
            if err.errno not in _NO_TMPFILE:
                raise
        else:
            os.close(fd)
            return
    probe = folder / f".gputrain-write-test-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    probe.unlink()
