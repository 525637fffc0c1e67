"""Work run inside the spawned ranks of test_token_loss.py (importable by the spawn start method)."""

from __future__ import annotations

from typing import Any


def token_runs(rank: int, runs: list[tuple[str, dict[str, Any], int]]) -> list[bool]:
    """Train the tiny GPT on the uneven -100 data for each (run_dir, overrides, its layers), the
    process group reused across runs; returns whether each run's step normalised over the global
    batch's tokens."""
    from gputrain import Trainer
    from tests.unit.train.test_token_loss import SPEC, config, tiny_gpt, uneven_data

    normalised = []
    for run_dir, overrides, n_layer in runs:
        trainer = Trainer(tiny_gpt(n_layer), uneven_data(), config=config(**overrides), run_dir=run_dir, spec=SPEC)
        trainer.fit()
        normalised.append(trainer.parts.step.tokens is not None)  # built by fit() at the latest
    return normalised
