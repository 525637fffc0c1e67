"""File-system failures said as what they are: one line naming the path, what is wrong with its file
system and what to do, for every command that writes.

An OSError's own text says too little ("[Errno 30] Read-only file system", "No space left on device"
for a file system out of inodes with 60 MiB free, "[Errno 1] Operation not permitted" for a file
made immutable) or nothing at all (Python's "Symlink loop" RuntimeError, a working directory that was
deleted). `said` (and `reason`, without the path) turns one into a line, which the write probe's
callers (run/files.py's check_run_dir, run/output.py's checks), the writers' clean-up (disk_full.py)
and a run's record of its failure (run/record.py) say; `check_inodes` asks a run directory's file
system for inodes before any work, and `check_working_directory` asks, at the entry point, whether
the process's working directory still exists. Torch-free: the entry point asks before torch loads.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from gputrain.errors import UsageError

FEW_INODES = 32
"""Free inodes below which a run directory is refused before work: a run makes its config, env,
metrics, summary and a checkpoint directory of five files per checkpoint kept (a few dozen files)."""


def said(err: BaseException, path: Path | str | None = None) -> str | None:
    """One line for a file-system failure: `path` (else the error's own file name), what is wrong
    and what to do. None where `err` is not one of these (the caller says it as it would have)."""
    why = reason(err, path)
    if why is None:
        return None
    where = path if path is not None else getattr(err, "filename", None)
    return f"{where}: {why}" if where is not None else why


def reason(err: BaseException, path: Path | str | None = None) -> str | None:
    """`said`'s line without the path: what is wrong with the file system of `path` and what to do."""
    code = error_code(err)
    if code is None:
        return None
    where = Path(path if path is not None else getattr(err, "filename", None) or ".")
    if code == errno.EROFS:
        return "the file system is read-only: choose a directory on a writable one"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return space_left(where, quota=code == errno.EDQUOT)
    if code == errno.EPERM:
        return (
            "the operation is not permitted: a file or folder made immutable or append-only (lsattr shows it, "
            "chattr -i / -a clears it), or a virtual file system"
        )
    if code == errno.EACCES:
        return "permission denied: give this user write access to it, or choose another directory"
    if code == errno.ELOOP:
        return "a loop of symbolic links: give a path whose links end in a directory"
    if code == errno.ENOENT and not _working_directory_exists():
        return working_directory_gone()
    return None


def error_code(err: BaseException) -> int | None:
    """The errno behind `err`: an OSError's own, pathlib's "Symlink loop" (a RuntimeError before
    Python 3.13), or the "(os error N)" of an error from Rust code (safetensors' writer)."""
    code = getattr(err, "errno", None)
    if isinstance(code, int):
        return code
    text = str(err)
    if isinstance(err, RuntimeError) and "Symlink loop" in text:
        return errno.ELOOP
    found = _OS_ERROR.search(text)
    return int(found.group(1)) if found else None


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def space_left(path: Path, quota: bool = False) -> str:
    """What is left on `path`'s file system: no inode (no new file, whatever the bytes free), no
    byte, or the user's quota spent."""
    free, inodes = _free(path)
    shown = f"{free / 2**20:,.1f} MiB free" if free is not None else "free space unknown"
    if quota:
        return f"disk quota exceeded ({shown} on the device): free some of your files, or ask for a larger quota"
    if inodes == 0:
        return (
            f"the file system has no free inodes left: no new file can be made there ({shown}, but no inode); "
            "remove files (many small ones, usually), or choose another file system"
        )
    return f"no space left on the device ({shown}): free some space, or choose another file system"


def _free(path: Path) -> tuple[int | None, int | None]:
    """(bytes free to this user, inodes free to this user) of `path`'s file system, from its nearest
    existing folder; an inode count of None where the file system counts none (btrfs says 0 of 0)."""
    folder = path
    while not os.path.isdir(folder) and folder != folder.parent:
        folder = folder.parent
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None, None
    inodes = stats.f_favail if stats.f_files > 0 else None
    return stats.f_bavail * stats.f_frsize, inodes


def check_inodes(folder: Path, where: str, files: int) -> None:
    """Before any work: `folder`'s file system has inodes for about `files` new files (a file system
    that counts none passes). Run after the write probe (run/probe.py), which says the rest.

    Raises:
        UsageError: one line naming `where` and what is left.
    """
    free, inodes = _free(folder)
    if inodes is not None and inodes < files:
        shown = f"{free / 2**20:,.1f} MiB free" if free is not None else "free space unknown"
        raise UsageError(
            f"{where}: the file system has {inodes} free inodes, and a run makes about {files} files ({shown}); "
            "remove files (many small ones, usually), or choose another file system"
        )


def _working_directory_exists() -> bool:
    try:
        os.getcwd()
    except OSError:
        return False
    return True


def working_directory_gone() -> str:
    return (
        "the working directory was deleted (or cannot be reached): cd into an existing directory and run "
        "the command again"
    )


def check_working_directory() -> None:
    """At the entry point, before torch loads (which would fail on it with an unrelated error):
    the process's working directory still exists.

    Raises:
        UsageError: naming it.
    """
    if not _working_directory_exists():
        raise UsageError(working_directory_gone())
