"""Work run inside the spawned ranks of test_token_shards.py (importable by the spawn start method)."""

from __future__ import annotations


def shard_runs(rank: int, runs: list[tuple[str, list[str]]]) -> list[int]:
    """Train each (run_dir, overrides) on the prepared folder in turn, the process group reused;
    returns each run's global step."""
    from gputrain import Trainer
    from tests.dist.test_token_shards import BASE

    return [Trainer.from_config(None, run_dir=run_dir, overrides=BASE + overrides).fit()["global_step"]
            for run_dir, overrides in runs]
