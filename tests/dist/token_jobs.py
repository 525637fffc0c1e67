"""Work run inside the spawned ranks of test_token_loss.py (importable by the spawn start method)."""

from __future__ import annotations

from typing import Any


def token_runs(rank: int, runs: list[tuple[str, dict[str, Any], str]]) -> list[bool]:
    """Train each (run_dir, overrides, model kind: test_token_loss.job_parts) on the uneven -100
    data, the process group reused across runs; returns whether each run's step normalised over
    the global batch's tokens."""
    from gputrain import Trainer
    from tests.unit.train.test_token_loss import config, job_parts

    normalised = []
    for run_dir, overrides, kind in runs:
        model, data, spec = job_parts(kind)
        trainer = Trainer(model, data, config=config(**overrides), run_dir=run_dir, spec=spec)
        trainer.fit()
        normalised.append(trainer.parts.step.tokens is not None)  # built by fit() at the latest
    return normalised
