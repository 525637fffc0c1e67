"""Ctrl-C, SIGTERM and Slurm's SIGUSR1: checkpoint, exit 130, resumable; a second signal exits at once
(issue 7, figure 7). Real processes, real signals."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from gputrain.checkpoint import find_resumable, verify_checkpoint
from tests.unit.reliability.chaos import (
    TINY,
    compare_runs,
    kill_at_step,
    run_train,
    second_signal_during_a_save,
    start_train,
)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_signal_checkpoints_and_exits_130(sig: signal.Signals, tmp_path: Path, reference_run: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, TINY)
    assert kill_at_step(proc, run_dir, 6, sig=sig) is not None
    assert proc.returncode == 130
    output = run_dir.with_suffix(".log").read_text()
    match = re.search(rf"stopped by {sig.name} at step (\d+); checkpoint saved at (\S+); resume with: "
                      rf"gputrain train --run-dir {re.escape(str(run_dir))}$", output, re.MULTILINE)
    assert match, output[-1500:]
    step, path = int(match[1]), Path(match[2])
    assert path == run_dir / "checkpoints" / f"step-{step}"
    verify_checkpoint(path)
    assert find_resumable(run_dir / "checkpoints") == path  # nothing newer, nothing half-written
    if sig == signal.SIGTERM:  # one full resume: the interrupted run ends exactly like an unbroken one
        assert run_train(run_dir, TINY) == 0
        assert compare_runs(reference_run, run_dir) == []


def test_second_signal_exits_at_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # each phase of a checkpoint write sleeps 5 s, so a save takes over 25 s
    proc = start_train(run_dir, TINY, env={"GPUTRAIN_TEST_SAVE_PHASE_DELAY_S": "5"}, mark_stops=True)
    saving = second_signal_during_a_save(proc, run_dir)
    assert proc.wait(timeout=300) == 130
    # at once: the save under way was abandoned, not finished (which the first signal alone waits for)
    assert not (run_dir / "checkpoints" / saving).exists()
    assert "gputrain train: interrupted" in run_dir.with_suffix(".log").read_text()
    for path in (run_dir / "checkpoints").glob("step-*"):
        verify_checkpoint(path)  # the save it cut short left nothing at a final path
