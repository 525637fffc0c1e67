"""`gputrain rl` data-parallel: 2 real gloo ranks stepping 4 environments each train exactly like one
process stepping all 8 (every iteration's figures and the final weights, to float rounding), and a
checkpoint the 2 ranks wrote resumes on one process, which takes every environment back."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.harness import run_ranks

BASE = ["rl.num_envs=8", "rl.num_steps=16", "rl.num_minibatches=4", "rl.update_epochs=2", "rl.total_timesteps=768",
        "rl.hidden_sizes=[16,16]", "log.every_steps=1", "log.tensorboard=false", "log.progress=none",
        "train.device=cpu"]
CASES = {
    "cartpole": ["rl.env=CartPole-v1", "rl.max_episode_steps=20"],
    "pendulum": ["rl.env=Pendulum-v1", "rl.max_episode_steps=50"],  # normalisers: statistics over both ranks
}
STOPPED = "cartpole_stopped"
AGAIN = "cartpole_two_again"
TIMING = {"env_steps_per_s"}


def rl_job(rank: int, runs: list[tuple[str, list[str], int | None]]) -> list[dict[str, Any]]:
    """On each rank: train each (run_dir, overrides, iteration to stop at with SIGTERM) in turn."""
    from gputrain.errors import Interrupted
    from gputrain.rl.trainer import PPOTrainer

    summaries = []
    for run_dir, overrides, stop_at in runs:
        def on_iteration(i: int, stop_at: int | None = stop_at) -> None:
            if i == stop_at and rank == 0:  # a signal to one rank: the ranks agree to stop together
                os.kill(os.getpid(), signal.SIGTERM)

        try:
            summaries.append(PPOTrainer(None, run_dir=run_dir, overrides=overrides).fit(on_iteration))
        except Interrupted as err:
            summaries.append({"status": "interrupted", "message": str(err)})
    return summaries


@pytest.fixture(scope="module")
def rl_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from gputrain.rl.trainer import PPOTrainer

    root = tmp_path_factory.mktemp("rl_dist")
    dirs = {}
    for name, extra in CASES.items():
        dirs[f"{name}_one"] = root / f"{name}_one"
        PPOTrainer(None, run_dir=dirs[f"{name}_one"], overrides=BASE + extra).fit()
        dirs[f"{name}_two"] = root / f"{name}_two"
    dirs[STOPPED] = root / STOPPED
    dirs[AGAIN] = root / AGAIN
    runs = [(str(dirs[f"{name}_two"]), BASE + extra, None) for name, extra in CASES.items()]
    runs.append((str(dirs[AGAIN]), BASE + CASES["cartpole"], None))
    runs.append((str(dirs[STOPPED]), BASE + CASES["cartpole"], 3))
    summaries = run_ranks(rl_job, runs, timeout_s=240)
    assert summaries[0][-1]["status"] == summaries[1][-1]["status"] == "interrupted", summaries
    return dirs


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _assert_same_training(got: Path, expected: Path, steps: list[int]) -> None:
    rows, reference = _rows(got), {row["step"]: row for row in _rows(expected)}
    assert [row["step"] for row in rows] == steps
    for row in rows:
        ref = reference[row["step"]]
        assert row.keys() == ref.keys()
        for key, value in row.items():
            if isinstance(value, float):
                assert value == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (row["step"], key)
            else:
                assert value == ref[key], (row["step"], key)
    weights, ref_weights = load_file(got / "model.safetensors"), load_file(expected / "model.safetensors")
    assert weights.keys() == ref_weights.keys()
    for key in ref_weights:
        torch.testing.assert_close(weights[key], ref_weights[key], rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_train_like_one_process_with_all_the_environments(rl_runs: dict[str, Path], case: str) -> None:
    _assert_same_training(rl_runs[f"{case}_two"], rl_runs[f"{case}_one"], [1, 2, 3, 4, 5, 6])
    summary = json.loads((rl_runs[f"{case}_two"] / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["rl"]["env_steps"] == 768
    one_process = json.loads((rl_runs[f"{case}_one"] / "summary.json").read_text())
    assert summary["rl"]["episodes"] == one_process["rl"]["episodes"]


def test_the_same_two_rank_job_is_the_same_run_bit_for_bit(rl_runs: dict[str, Path]) -> None:
    """What docs/rl.md promises beyond float rounding: the same job on the same ranks repeats exactly
    (N ranks against one process agree only to rounding, which grows over a long run)."""
    assert _rows(rl_runs[AGAIN]) == _rows(rl_runs["cartpole_two"])
    assert (rl_runs[AGAIN] / "model.safetensors").read_bytes() == (
        rl_runs["cartpole_two"] / "model.safetensors"
    ).read_bytes()


def test_a_two_rank_checkpoint_resumes_on_one_process(rl_runs: dict[str, Path], tmp_path: Path) -> None:
    from gputrain.rl.trainer import PPOTrainer

    checkpoint = rl_runs[STOPPED] / "checkpoints" / "step-3"
    assert (checkpoint / ".metadata").is_file()  # written by both ranks (torch.distributed.checkpoint)
    run_dir = tmp_path / "continued"
    PPOTrainer(None, run_dir=run_dir, overrides=[*BASE, *CASES["cartpole"], f"checkpoint.resume={checkpoint}"]).fit()
    _assert_same_training(run_dir, rl_runs["cartpole_one"], [4, 5, 6])
