"""SIGKILL a whole 2-rank job (the launcher and both gloo ranks, as a node failure would) at a
random step, run the same command again, and get the unbroken 2-rank run bit for bit
(issue 7, figure 1 with 2 ranks; `scripts/kill_resume.py --ranks 2 --trials 20` prints the figure)."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest

from tests.unit.reliability.chaos import TINY_2_RANKS, compare_runs, kill_at_step, run_train, start_train
from tests.waiting import wait_until


def _live_processes(run_dir: Path) -> list[int]:
    """The processes whose command line names `run_dir` (the launcher and its ranks) that have not
    exited (a zombie has: it writes nothing)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            named = str(run_dir).encode() in (proc / "cmdline").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]  # after the name, which may hold spaces
        except (OSError, IndexError):  # exited meanwhile
            continue
        if named and state != "Z":
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_sigkill_of_a_two_rank_job_then_resume_is_bit_identical(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    assert run_train(reference, TINY_2_RANKS) == 0, reference.with_suffix(".log").read_text()[-2000:]
    total = json.loads((reference / "summary.json").read_text())["global_step"]
    run_dir = tmp_path / "killed"
    killed_at = kill_at_step(start_train(run_dir, TINY_2_RANKS), run_dir, random.Random(5).randint(5, total - 5))
    assert killed_at is not None and killed_at < total, "the job ended before it could be killed"
    # every process of the job is gone (an orphaned rank would write on into the run directory)
    wait_until(lambda: not _live_processes(run_dir), 60, "every process of the killed job to exit")
    assert not (run_dir / "summary.json").exists()
    assert run_train(run_dir, TINY_2_RANKS) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
    assert compare_runs(reference, run_dir) == [], f"killed at step {killed_at}"


@pytest.mark.slow
def test_sigterm_to_a_two_rank_job_checkpoints_once_exits_130_and_resumes_exactly(tmp_path: Path) -> None:
    """Slurm pre-empts with SIGTERM to every process of the job: the ranks agree on one step, save it
    together, and the job exits 130 with one message; running it again continues bit for bit."""
    reference = tmp_path / "reference"
    assert run_train(reference, TINY_2_RANKS) == 0, reference.with_suffix(".log").read_text()[-2000:]
    run_dir = tmp_path / "stopped"
    proc = start_train(run_dir, TINY_2_RANKS)
    assert kill_at_step(proc, run_dir, 10, sig=signal.SIGTERM) is not None
    log = run_dir.with_suffix(".log").read_text()
    assert proc.returncode == 130, log[-2000:]
    assert "Traceback" not in log
    stopped = [line for line in log.splitlines() if line.startswith("gputrain train: stopped by SIGTERM")]
    assert len(stopped) == 2, stopped  # rank 0 (with the checkpoint) and the launcher; not every rank
    assert run_train(run_dir, TINY_2_RANKS) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
    assert compare_runs(reference, run_dir) == []
