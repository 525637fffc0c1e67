"""Two gloo ranks stopped by a SIGTERM to the launcher at a known moment of the run's end (the last
validation, a checkpoint), then the same command again: the unbroken 2-rank run's weights and every
metrics.jsonl row once, bit for bit (issue 35: 78 rows differed). Each rank is held at the point
until its signal has come (run/hold.py), so the moment is the same every time."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.unit.reliability.chaos import TINY_2_RANKS, compare_runs, run_train, stop_at

LAST = 38


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("unbroken") / "run"
    assert run_train(run_dir, TINY_2_RANKS) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("at", [f"val:{LAST}", "checkpoint:36"])
def test_a_two_rank_run_stopped_at_its_end_resumes_to_the_unbroken_run(
    at: str, reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "stopped"
    assert stop_at(run_dir, TINY_2_RANKS, at, signal.SIGTERM, ranks=2) == 130, run_dir.with_suffix(".log").read_text()[
        -2000:
    ]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert run_train(run_dir, TINY_2_RANKS) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
    assert compare_runs(reference, run_dir) == []
