"""run/probe.py: a folder's check that it takes files leaves nothing in it, however the process ends."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gputrain.run.probe import check_takes_files


def test_the_check_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    check_takes_files(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_takes_no_files_raises_the_systems_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        check_takes_files(Path("/proc/self"))  # a virtual file system: no new files there
    with pytest.raises(OSError):
        check_takes_files(tmp_path / "missing")


def test_without_unnamed_files_a_named_probe_is_made_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without O_TMPFILE (a fact this machine's ext4/tmpfs cannot produce): the named probe."""
    real_open, seen = os.open, []

    def no_tmpfile(path: object, flags: int, mode: int = 0o777) -> int:
        if flags & getattr(os, "O_TMPFILE", 0) == getattr(os, "O_TMPFILE", -1):
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        seen.append(Path(str(path)).name)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", no_tmpfile)
    check_takes_files(tmp_path)
    assert seen == [f".gputrain-write-test-{os.getpid()}"] and list(tmp_path.iterdir()) == []
