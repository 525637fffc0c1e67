"""A disk that fills up while a run saves: the partial files are removed at once (else the run's own
record would not fit either, and the run would end with no summary.json), the failure is one line
that says so, and once space is freed the run resumes from its last complete checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrain.cli import main
from gputrain.disk_full import DiskFull, removed_if_failed

QUICK = ["log.progress=none", "log.tensorboard=false", "train.epochs=2"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real file system of 3 MiB (tmpfs), where this machine lets the tests mount one."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small tmpfs cannot be mounted here (needs root): {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def _resize(where: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)


def _no_partial_files(run_dir: Path) -> bool:
    return not [p for p in run_dir.rglob("*") if ".tmp-" in p.name]


def test_a_checkpoint_that_fills_the_disk_is_one_line_a_summary_and_a_resume(small_disk: Path, capsys) -> None:
    run_dir = small_disk / "run"
    assert main(["train", "--run-dir", str(run_dir), *QUICK]) == 1  # step-19 fits, step-38 does not
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"gputrain train: no space left on the device for the checkpoint of step 38 in "
                           f"{run_dir / 'checkpoints'} (")
    assert line.endswith("free); its partial files are removed: free some space and run again (a resume continues "
                         "from the last complete checkpoint)")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["global_step"] == 38 and "no space left" in summary["error"]
    assert _no_partial_files(run_dir) and sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-19"]
    _resize(small_disk, "20M")
    assert main(["train", "--run-dir", str(run_dir), *QUICK]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 38


def test_final_weights_that_fill_the_disk_leave_a_summary(small_disk: Path, capsys) -> None:
    _resize(small_disk, "300K")  # the default cnn's weights take ~0.6 MiB
    run_dir = small_disk / "run"
    assert main(["train", "--run-dir", str(run_dir), *QUICK, "checkpoint.enabled=false"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"gputrain train: no space left on the device for the weights (model.safetensors) in "
                           f"{run_dir} (")
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert _no_partial_files(run_dir) and not (run_dir / "model.safetensors").exists()


# ----------------------------------------------------------------------------- the mechanism, on any machine
def test_torchs_short_write_on_a_nearly_full_disk_is_a_full_disk(tmp_path: Path, monkeypatch) -> None:
    """torch's zip writer says only "unexpected pos" when the disk fills: the free space decides."""
    partial = tmp_path / ".step-4.tmp-1"
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    with pytest.raises(DiskFull, match=r"^no space left on the device for the checkpoint of step 4 in .* \(0\.0 MiB free\)"):
        with removed_if_failed(partial, "the checkpoint of step 4"):
            partial.mkdir()
            (partial / "state.pt").write_bytes(b"x" * 1000)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 167808 vs 167700")
    assert not partial.exists()


def test_another_failure_while_saving_stays_itself_and_leaves_no_partial_file(tmp_path: Path) -> None:
    partial = tmp_path / ".model.safetensors.tmp-1"
    with pytest.raises(PermissionError, match="read-only"):
        with removed_if_failed(partial, "the weights (model.safetensors)"):
            partial.write_bytes(b"half")
            raise PermissionError(os.strerror(13) + ": read-only")
    assert not partial.exists()


def test_a_disk_full_before_the_start_leaves_no_empty_temporaries(small_disk: Path, capsys) -> None:
    """Before: `training failed at step 1: OSError: [Errno 28] … (traceback in …/error.log)`, an
    error.log that did not exist, and three empty `.tmp-` files left behind."""
    run_dir = small_disk / "run"
    run_dir.mkdir()
    with open(small_disk / "filler", "wb") as filler, contextlib.suppress(OSError):
        while True:
            filler.write(b"\0" * 65536)
    assert main(["train", "--run-dir", str(run_dir), *QUICK]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"gputrain train: no space left on the device for config.toml in {run_dir} (0.0 MiB free); its partial "
        "files are removed: free some space and run again (a resume continues from the last complete checkpoint)")
    assert list(run_dir.iterdir()) == []


def test_a_traceback_that_cannot_be_written_is_not_said_to_be_there(tmp_path: Path) -> None:
    from gputrain.run.record import _save_traceback

    blocked = tmp_path / "file"
    blocked.write_text("a file where the run directory would be")
    try:
        raise RuntimeError("a failure in a step")
    except RuntimeError:
        assert _save_traceback(blocked, blocked / "error.log") == (
            f"no traceback: {blocked / 'error.log'} could not be written")
        assert _save_traceback(tmp_path, tmp_path / "error.log") == f"traceback in {tmp_path / 'error.log'}"
    assert "RuntimeError: a failure in a step" in (tmp_path / "error.log").read_text()
