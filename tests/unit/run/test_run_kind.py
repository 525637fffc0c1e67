"""Which kind of run a directory holds (run/prior.py's `run_kind`): env.json's record, or for a
directory written before it was recorded, what only one kind writes; and who holds a directory in
use (run/lock.py's `lock_holder`)."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from gputrain.errors import UsageError
from gputrain.run.lock import lock_holder
from gputrain.run.prior import PriorRun, check_run_kind, prior_run, run_kind

TRAIN_SUMMARY = {"status": "completed", "device": "cpu", "global_step": 8, "train": {}}
RL_SUMMARY = {**TRAIN_SUMMARY, "rl": {"env": "CartPole-v1"}}
START_UP_FAILURE = {"status": "failed", "device": None, "global_step": 0, "train": {}}
TRAIN_ROW = {"step": 1, "loss": 0.5, "lr": 0.001}
RL_ROW = {"step": 1, "env_steps": 512, "episodic_return": 20.0}


def _write(run_dir: Path, env: object = None, summary: object = None, row: object = None) -> Path:
    run_dir.mkdir()
    if env is not None:
        (run_dir / "env.json").write_text(json.dumps(env))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    if row is not None:
        (run_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    return run_dir


@pytest.mark.parametrize(("env", "summary", "row", "kind"), [
    ({"run": {"kind": "rl"}}, TRAIN_SUMMARY, TRAIN_ROW, "rl"),  # recorded: the record decides
    ({"run": {"kind": "train"}}, RL_SUMMARY, None, "train"),
    ({"run": {"device": "cpu"}}, RL_SUMMARY, None, "rl"),  # written before the kind was recorded
    ({"run": {"device": "cpu"}}, TRAIN_SUMMARY, None, "train"),
    (None, RL_SUMMARY, None, "rl"),
    (None, TRAIN_SUMMARY, RL_ROW, "train"),
    (None, START_UP_FAILURE, None, None),  # failed before it was placed: it does not say
    (None, START_UP_FAILURE, RL_ROW, "rl"),  # killed before any summary of its own: its rows tell
    (None, None, TRAIN_ROW, "train"),
    (None, None, {"no": "step"}, None),
    ({"run": {"kind": "gan"}}, None, None, None),  # a kind no command makes: not told
    ({"run": "rl"}, None, None, None),
    ([1, 2], None, None, None),
], ids=["recorded-rl", "recorded-train", "old-rl-summary", "old-train-summary", "rl-summary", "train-summary",
        "start-up-failure", "rows-after-failure", "train-rows", "rows-without-step", "unknown-kind", "run-not-a-dict",
        "env-not-a-dict"])
def test_the_kind_a_directory_holds(tmp_path: Path, env: object, summary: object, row: object,
                                    kind: str | None) -> None:
    run_dir = _write(tmp_path / "run", env, summary, row)
    assert run_kind(run_dir, summary if isinstance(summary, dict) else None) == kind
    prior = prior_run(run_dir)  # None where the directory holds no run's record beside env.json
    assert (prior.kind if prior is not None else None) == kind


def test_unreadable_records_tell_nothing_and_never_block(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "env.json")  # a read would wait for a writer
    os.mkfifo(run_dir / "metrics.jsonl")
    assert run_kind(run_dir, None) is None
    (run_dir / "env.json").unlink()
    (run_dir / "env.json").write_bytes(b"\xff\xfe not json")
    assert run_kind(run_dir, None) is None


@pytest.mark.parametrize(("held", "command"), [("rl", "train"), ("train", "rl")])
def test_a_run_of_the_other_kind_is_refused_naming_both(tmp_path: Path, held: str, command: str) -> None:
    prior = PriorRun({"status": "completed", "global_step": 6}, checkpoints=True, kind=held)
    with pytest.raises(UsageError) as err:
        check_run_kind(tmp_path, prior, command)
    assert str(err.value) == (
        f"{tmp_path} holds a completed run (step 6) made by gputrain {held}; gputrain {command} does not continue "
        "another command's run (a run directory holds one run): choose another run_dir for a new run")


@pytest.mark.parametrize("kind", ["rl", None])
def test_the_same_kind_or_an_unknown_one_passes(tmp_path: Path, kind: str | None) -> None:
    check_run_kind(tmp_path, PriorRun(None, checkpoints=True, kind=kind), "rl")
    check_run_kind(tmp_path, None, "rl")


def test_the_holder_of_a_directory_is_named(tmp_path: Path) -> None:
    held = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    other = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not Path("/proc/locks").is_file():
            pytest.skip("no /proc/locks on this system")
        assert lock_holder(other) == f"process {os.getpid()}"  # pytest runs no gputrain command
        assert lock_holder(other, tmp_path / "no-such-table") is None
        (tmp_path / "locks").write_text("1: POSIX  ADVISORY  WRITE 77 00:00:1 0 EOF\n")
        assert lock_holder(other, tmp_path / "locks") is None  # no lock on this directory
    finally:
        os.close(other)
        os.close(held)
