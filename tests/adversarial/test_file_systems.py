"""Odd file systems under every command that writes: a read-only mount, a file system out of inodes,
a loop of symbolic links, a file or folder made immutable (chattr +i), a working directory deleted
under the process, a folder named gputrain in the working directory. Each is said as what it is, in
one line naming the path (run/fs_errors.py), exit 2 before any work where it can be seen then, and a
summary.json (or a line saying it could not be written) where a run had begun.

Real mounts (tmpfs, read-only or with few inodes) where this machine lets the tests mount one (root),
chattr where the file system keeps the flag (ext4, xfs, tmpfs on newer kernels); skipped, naming why,
elsewhere."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gputrain import Trainer
from gputrain.child_python import child_environment
from gputrain.cli import main
from gputrain.disk_full import DiskFull, FileSystemFailure, removed_if_failed
from gputrain.run.fs_errors import said
from tests.adversarial.helpers import QUIET, linear_data

TINY = [
    "model.name=mlp",
    "model.hidden_sizes=[8]",
    "train.device=cpu",
    "train.max_steps=2",
    "train.epochs=1",
    "log.progress=none",
    "log.tensorboard=false",
]


def _mount(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here (needs root): {done.stderr.decode().strip()}")


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """mount(name, options) -> a real tmpfs under tmp_path; unmounted after the test."""
    made: list[Path] = []

    def mount(name: str, options: str) -> Path:
        where = tmp_path / name
        _mount(where, options)
        made.append(where)
        return where

    yield mount
    for where in reversed(made):
        subprocess.run(["umount", "-l", str(where)], check=False)


def _read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)


def _fill_inodes(where: Path, leave: int = 0) -> None:
    """Create empty files until the file system has `leave` inodes free."""
    i = 0
    while os.statvfs(where).f_favail > leave:
        (where / f"f{i}").touch()
        i += 1


@pytest.fixture
def chattr(tmp_path: Path) -> Iterator[Callable[[Path, str], None]]:
    """chattr(path, "+i") where the file system keeps the flag; every flag cleared after the test."""
    flagged: list[Path] = []
    probe = tmp_path / ".probe"
    probe.touch()
    tried = subprocess.run(["chattr", "+i", str(probe)], capture_output=True)
    if tried.returncode != 0:
        pytest.skip(f"chattr +i does not work on {tmp_path}'s file system: {tried.stderr.decode().strip()}")
    subprocess.run(["chattr", "-i", str(probe)], check=True)

    def flag(path: Path, how: str) -> None:
        subprocess.run(["chattr", how, str(path)], check=True)
        flagged.append(path)

    yield flag
    for path in flagged:
        subprocess.run(["chattr", "-i", "-a", str(path)], check=False)


@pytest.fixture(scope="module")
def complete_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("complete") / "run"
    assert main(["train", "--run-dir", str(run_dir), *TINY]) == 0
    return run_dir


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    return err


def _copy_run(run: Path, into: Path) -> Path:
    copy = into / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints"))  # the final weights are enough
    return copy


# ----------------------------------------------------------------------------- before any work: exit 2, one line
READ_ONLY = [
    ("train a new run", lambda run, ro: ["train", "--run-dir", str(ro / "new"), *TINY]),
    ("train a complete run again", lambda run, ro: ["train", "--run-dir", str(run)]),
    ("lr-find", lambda run, ro: ["lr-find", "--run-dir", str(run)]),
    ("rl", lambda run, ro: ["rl", "--run-dir", str(ro / "rl")]),
    ("evaluate", lambda run, ro: ["evaluate", str(run)]),
    ("bench-infer", lambda run, ro: ["bench-infer", str(run), "--batch", "1", "--modes", "eager"]),
    ("report", lambda run, ro: ["report", str(run)]),
    ("export", lambda run, ro: ["export", str(run), "--format", "safetensors"]),
    ("predict -o", lambda run, ro: ["predict", str(run), str(ro.parent / "x.npy"), "-o", str(ro / "p.csv")]),
    (
        "prepare --out",
        lambda run, ro: ["prepare", str(ro.parent / "c.txt"), "--out", str(ro / "prep"), "--train-tokenizer", "300"],
    ),
]


@pytest.mark.parametrize("build", [b for _, b in READ_ONLY], ids=[name for name, _ in READ_ONLY])
def test_a_read_only_mount_is_said_before_any_work(build, complete_run: Path, mounts, capsys) -> None:
    ro = mounts("ro", "size=16m")
    run = _copy_run(complete_run, ro)
    torch.save(torch.zeros(2, 64), ro.parent / "x.pt")
    (ro.parent / "c.txt").write_text("some text to prepare\n" * 20)
    import numpy as np

    np.save(ro.parent / "x.npy", np.zeros((2, 64), dtype="float32"))
    _read_only(ro)
    assert main(build(run, ro)) == 2
    assert "read-only" in _one_line(capsys)


INODES = [
    ("train a new run", lambda run, fs: ["train", "--run-dir", str(fs / "new"), *TINY]),
    ("evaluate", lambda run, fs: ["evaluate", str(run)]),
    ("report", lambda run, fs: ["report", str(run)]),
    ("export", lambda run, fs: ["export", str(run), "--format", "safetensors"]),
]


@pytest.mark.parametrize("build", [b for _, b in INODES], ids=[name for name, _ in INODES])
def test_a_file_system_out_of_inodes_is_not_called_out_of_space(build, complete_run: Path, mounts, capsys) -> None:
    fs = mounts("inodes", "size=64m,nr_inodes=64")
    run = _copy_run(complete_run, fs)
    _fill_inodes(fs)
    assert main(build(run, fs)) == 2
    line = _one_line(capsys)
    assert "no free inodes" in line and "MiB free" in line, line


def test_a_run_directory_with_too_few_inodes_left_is_refused_before_work(mounts, capsys) -> None:
    fs = mounts("few", "size=64m,nr_inodes=64")
    _fill_inodes(fs, leave=8)  # the probe passes; the run's files would not fit
    assert main(["train", "--run-dir", str(fs / "run"), *TINY]) == 2
    line = _one_line(capsys)
    assert re.search(r"the file system has [78] free inodes, and a run makes about 32 files", line), line
    assert not (fs / "run").exists()


LOOPS = [
    ("train", lambda loop: ["train", "--run-dir", str(loop), *TINY]),
    ("train, inside the loop", lambda loop: ["train", "--run-dir", str(loop / "sub"), *TINY]),
    ("rl", lambda loop: ["rl", "--run-dir", str(loop)]),
    ("lr-find", lambda loop: ["lr-find", "--run-dir", str(loop)]),
    ("evaluate", lambda loop: ["evaluate", str(loop)]),
    ("report", lambda loop: ["report", str(loop)]),
]


@pytest.mark.parametrize("build", [b for _, b in LOOPS], ids=[name for name, _ in LOOPS])
def test_a_run_directory_that_is_a_loop_of_links_is_one_line(build, tmp_path: Path, capsys) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert main(build(tmp_path / "a")) == 2
    line = _one_line(capsys)
    assert str(tmp_path / "a") in line and "RuntimeError" not in line, line


DELETED_CWD = [
    ("train, relative run dir", ["train", "--run-dir", "runs/x", *TINY]),
    ("evaluate", ["evaluate", "runs/x"]),
    ("report", ["report", "runs/x"]),
    ("prepare", ["prepare", "c.txt", "--out", "prep", "--train-tokenizer", "300"]),
]


@pytest.mark.parametrize("argv", [a for _, a in DELETED_CWD], ids=[name for name, _ in DELETED_CWD])
def test_a_deleted_working_directory_is_said_before_torch_would_trip_on_it(argv, tmp_path: Path, capsys) -> None:
    here = os.getcwd()
    gone = tmp_path / "gone"
    gone.mkdir()
    os.chdir(gone)
    gone.rmdir()
    try:
        assert main(argv) == 2
    finally:
        os.chdir(here)
    assert "the working directory was deleted" in _one_line(capsys)


def test_a_deleted_working_directory_under_a_fresh_process(tmp_path: Path) -> None:
    """The whole command as a user runs it: torch's libraries would fail to load there (MKL's
    "Cannot load libtorch_cpu.so"), so it is said at the entry point."""
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (
        "import os, sys, runpy; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); sys.argv = sys.argv[1:]; "
        "runpy.run_module('gputrain', run_name='__main__', alter_sys=True)"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", code, str(gone), "train", "--run-dir", str(tmp_path / "r"), *TINY],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "gputrain train: the working directory was deleted (or cannot be reached): cd into "
        "an existing directory and run the command again"
    )


def test_an_immutable_run_directory_is_said_before_work(tmp_path: Path, chattr, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    chattr(run, "+i")
    assert main(["train", "--run-dir", str(run), *TINY]) == 2
    line = _one_line(capsys)
    assert "not permitted" in line and "immutable" in line, line


# ----------------------------------------------------------------------------- during a run: a record, one line
class _AtStep:
    """A callback that does `act` once after step `step` (what a user or another program does to the
    run's files meanwhile)."""

    def __init__(self, step: int, act: Callable[[], None]) -> None:
        self.step, self.act = step, act

    def on_step_end(self, trainer, step, metrics) -> None:
        if step == self.step:
            self.act()


def _trainer(run_dir: Path, callback: _AtStep) -> Trainer:
    torch.manual_seed(0)
    return Trainer(
        nn.Linear(6, 3),
        linear_data(),
        loss_fn=F.cross_entropy,
        callbacks=[callback],
        config={**QUIET, "checkpoint.every_steps": 2},
        run_dir=run_dir,
    )


def test_metrics_made_immutable_mid_run_fails_with_one_line_and_a_summary(tmp_path: Path, chattr) -> None:
    run_dir = tmp_path / "run"
    trainer = _trainer(run_dir, _AtStep(3, lambda: chattr(run_dir / "metrics.jsonl", "+i")))
    with pytest.raises(Exception) as failed:
        trainer.fit()
    message = str(failed.value)
    assert "metrics.jsonl: the operation is not permitted" in message and "immutable" in message, message
    assert "PermissionError" not in message
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "immutable" in summary["error"]


def test_a_run_directory_made_immutable_mid_run_says_so_and_that_no_summary_could_be_written(
    tmp_path: Path, chattr, capsys
) -> None:
    """The final weights cannot be made, nor then the summary: both said, as what they are."""
    run_dir = tmp_path / "run"
    trainer = _trainer(run_dir, _AtStep(3, lambda: chattr(run_dir, "+i")))
    with pytest.raises(FileSystemFailure) as failed:
        trainer.fit()
    assert str(failed.value).startswith(
        f"the weights (model.safetensors) could not be written in {run_dir}: the "
        "operation is not permitted: a file or folder made immutable"
    ), failed.value
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (
        f"the run's summary.json could not be written: {run_dir / 'summary.json'}: the operation is not permitted"
    ) in err, err


# ----------------------------------------------------------------------------- the mechanism
def test_removing_a_temporary_on_a_read_only_mount_is_no_second_error(mounts) -> None:
    ro = mounts("ro-tmp", "size=1m")
    _read_only(ro)
    partial = ro / ".eval-test.json.tmp-1"
    expected = r"^eval-test.json could not be written in .*: the file system is read-only"
    with pytest.raises(FileSystemFailure, match=expected) as failed, removed_if_failed(partial, "eval-test.json"):
        partial.write_text("{}")
    assert failed.value.errno == errno.EROFS  # still an OSError with its errno, for the callers that look


def test_a_write_out_of_inodes_is_said_as_such(mounts) -> None:
    fs = mounts("ino-tmp", "size=64m,nr_inodes=16")
    _fill_inodes(fs)
    expected = (
        r"^no free inodes \(no new file can be made\) left on the device for x in .* \(6\d\.\d MiB free, "
        r"no inode\); its partial files are removed: remove files"
    )
    with pytest.raises(DiskFull, match=expected), removed_if_failed(fs / ".x.tmp", "x"):
        (fs / ".x.tmp").write_text("x")


SAID = [
    (OSError(errno.EROFS, "Read-only file system"), "the file system is read-only"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
    (OSError(errno.EPERM, "Operation not permitted"), "immutable or append-only"),
    (PermissionError(errno.EACCES, "Permission denied"), "permission denied: give this user write access"),
    (OSError(errno.ELOOP, "Too many levels of symbolic links"), "a loop of symbolic links"),
    (RuntimeError("Symlink loop from '/x'"), "a loop of symbolic links"),
]


@pytest.mark.parametrize(("err", "expected"), SAID, ids=[str(e) for e, _ in SAID])
def test_each_failure_is_named_with_its_path(err: BaseException, expected: str, tmp_path: Path) -> None:
    line = said(err, tmp_path / "f")
    assert line is not None and line.startswith(f"{tmp_path / 'f'}: ") and expected in line


def test_other_errors_are_left_to_their_callers(tmp_path: Path) -> None:
    assert said(OSError(errno.EIO, "I/O error"), tmp_path) is None
    assert said(FileNotFoundError(errno.ENOENT, "No such file"), tmp_path) is None  # the working directory exists
    assert said(ValueError("x"), tmp_path) is None


# ----------------------------------------------------------------------------- a folder named gputrain
def _shadowing_folder(where: Path) -> Path:
    package = where / "gputrain"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('the shadowing gputrain was imported')\n")
    (package / "__main__.py").write_text("")
    return where


def test_a_child_python_imports_this_gputrain_not_the_working_directorys(tmp_path: Path) -> None:
    cwd = _shadowing_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    shadowed = subprocess.run(
        [sys.executable, "-m", "gputrain", "--version"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert "shadowing gputrain" in shadowed.stderr  # what torchrun's `python -m gputrain` met before
    safe = subprocess.run(
        [sys.executable, "-m", "gputrain", "--version"],
        cwd=cwd,
        env=child_environment(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert safe.returncode == 0 and safe.stdout.startswith("gputrain "), safe.stderr


@pytest.mark.slow
def test_two_ranks_started_beside_a_folder_named_gputrain_train(tmp_path: Path) -> None:
    """The whole launch: torchrun's ranks run `python -m gputrain` in the user's working directory."""
    cwd = _shadowing_folder(tmp_path / "work")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; sys.path.pop(0); sys.argv[0] = 'gputrain'; "
            "runpy.run_module('gputrain', run_name='__main__', alter_sys=True)",
            "train",
            "--nproc-per-node",
            "2",
            "--run-dir",
            str(tmp_path / "run"),
            *TINY,
            "parallel.strategy=ddp",
            "parallel.timeout_s=30",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"


def test_metrics_made_immutable_before_a_resume_is_one_line_and_no_temporary(tmp_path: Path, chattr, capsys) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "--run-dir", str(run_dir), *TINY, "train.max_steps=4", "checkpoint.every_steps=2"]
    assert main([*args[:-2], "train.max_steps=2", "checkpoint.every_steps=2"]) == 0
    capsys.readouterr()
    chattr(run_dir / "metrics.jsonl", "+i")
    assert main(args) == 1  # train longer: the resume cuts metrics.jsonl back, which cannot be replaced
    line = _one_line(capsys)
    assert "metrics.jsonl could not be written in" in line and "not permitted" in line, line
    assert not list(run_dir.glob(".metrics.jsonl.tmp-*"))
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
