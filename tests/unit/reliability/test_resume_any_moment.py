"""A run stopped at any moment of its end — during a checkpoint, the last validation, the test
evaluation, the final save — and run again ends as the run that was never stopped: the final weights
byte for byte and every row of metrics.jsonl (timing fields aside) once, in order (issue 35).

The signal reaches the run at a known point (run/hold.py holds it there until the signal has come),
a real SIGTERM (or a SIGKILL, which leaves no checkpoint of its own) from outside."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.unit.reliability.chaos import TINY, compare_runs, run_train, stop_at, train_log

LAST = 38  # TINY's last step (2 epochs of 19); a checkpoint every 4 steps


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("unbroken") / "run"
    assert run_train(run_dir, TINY) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
    return run_dir


CASES = [
    # (where, the signal, the exit code of the stopped run, the status it leaves)
    (f"val:{LAST}", signal.SIGTERM, 130, "interrupted"),  # after the last validation: the end's checkpoint
    (f"checkpoint:{LAST}", signal.SIGTERM, 0, "completed"),  # the end's checkpoint: the run ends after it
    ("checkpoint:36", signal.SIGTERM, 130, "interrupted"),  # a periodic one
    (f"test:{LAST}", signal.SIGKILL, -9, None),  # the end's checkpoint taken; no summary
    ("final-save", signal.SIGKILL, -9, None),  # the test row written; no weights, no summary
    ("final-save", signal.SIGTERM, 0, "completed"),  # past the last poll: the run finishes what it began
]


@pytest.mark.slow
@pytest.mark.parametrize(("at", "sig", "code", "status"), CASES, ids=[f"{c[0]}-{c[1].name}" for c in CASES])
def test_a_run_stopped_at_its_end_resumes_to_the_unbroken_run(
    at, sig, code, status, reference: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "stopped"
    assert stop_at(run_dir, TINY, at, sig) == code, run_dir.with_suffix(".log").read_text()[-2000:]
    summary = run_dir / "summary.json"
    assert (json.loads(summary.read_text())["status"] if summary.exists() else None) == status
    assert run_train(run_dir, TINY) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
    assert compare_runs(reference, run_dir) == []
    assert len(train_log(run_dir)) == len(train_log(reference))
    done = json.loads(summary.read_text())
    unbroken = json.loads((reference / "summary.json").read_text())
    assert (done["status"], done["global_step"], done["val"], done["test"], done["best"]) == (
        unbroken["status"],
        unbroken["global_step"],
        unbroken["val"],
        unbroken["test"],
        unbroken["best"],
    )


SHORT = [*TINY, "train.max_steps=36"]  # ends mid-epoch at a step a periodic checkpoint saves


@pytest.mark.slow
def test_a_kill_after_a_periodic_checkpoint_of_the_last_step_takes_no_step_past_it(tmp_path: Path) -> None:
    """Step 36's periodic checkpoint comes before the end's validation: a run killed during that
    validation resumes from it, validates again (its row once) and trains no 37th step."""
    reference, run_dir = tmp_path / "unbroken", tmp_path / "killed"
    assert run_train(reference, SHORT) == 0, reference.with_suffix(".log").read_text()[-2000:]
    assert stop_at(run_dir, SHORT, "val:36", signal.SIGKILL) == -9
    assert run_train(run_dir, SHORT) == 0, run_dir.with_suffix(".log").read_text()[-2000:]
    assert compare_runs(reference, run_dir) == []
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == 36
