"""SIGKILL a real training process at a random step, resume it, and get the unbroken run bit for bit
(issue 7, figure 1; `scripts/kill_resume.py --trials 20` prints the full figure)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.unit.reliability.chaos import TINY, compare_runs, kill_at_step, run_train, start_train


@pytest.mark.slow
def test_sigkill_at_random_steps_then_resume_is_bit_identical(tmp_path: Path, reference_run: Path) -> None:
    total = json.loads((reference_run / "summary.json").read_text())["global_step"]
    rng = random.Random(11)
    for trial in range(3):
        run_dir = tmp_path / f"trial{trial}"
        killed_at = kill_at_step(start_train(run_dir, TINY), run_dir, rng.randint(1, total - 2))
        assert killed_at is not None and killed_at < total, "the run ended before it could be killed"
        assert not (run_dir / "summary.json").exists()
        assert run_train(run_dir, TINY) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
        assert compare_runs(reference_run, run_dir) == [], f"trial {trial}, killed at step {killed_at}"
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["global_step"] == total
