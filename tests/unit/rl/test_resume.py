"""Resume is bit-exact: a run stopped by SIGTERM after iteration 3 and run again ends with the same
weights, the same metrics rows and the same summary figures as a run that was never stopped:
every environment's state, the normalisers, the optimizer, the schedule and the counters that key
all randomness come back from the checkpoint. A complete run is left as it is; a checkpoint whose
environments are not this run's is refused before anything is applied."""

from __future__ import annotations

import io
import json
import os
import re
import signal
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from safetensors.torch import load_file

from gputrain.checkpoint.matching import CheckpointMismatch
from gputrain.cli import main
from gputrain.errors import Interrupted
from gputrain.rl.trainer import PPOTrainer

BASE = ["rl.num_envs=8", "rl.num_steps=16", "rl.num_minibatches=4", "rl.update_epochs=2", "rl.total_timesteps=768",
        "rl.hidden_sizes=[16,16]", "log.every_steps=1", "log.tensorboard=false", "log.progress=none",
        "train.device=cpu"]
TIMING = {"env_steps_per_s"}
CASES = {
    "cartpole": ["rl.env=CartPole-v1", "rl.max_episode_steps=20"],  # truncations to bootstrap
    "pendulum_normalised": ["rl.env=Pendulum-v1", "rl.max_episode_steps=50"],  # obs and reward normalisers
}


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _stop_at(iteration: int):
    def on_iteration(i: int) -> None:
        if i == iteration:
            os.kill(os.getpid(), signal.SIGTERM)  # what Ctrl-C or a scheduler does between iterations

    return on_iteration


@pytest.mark.parametrize("case", sorted(CASES))
def test_stopped_and_resumed_equals_unbroken(tmp_path: Path, case: str) -> None:
    overrides = BASE + CASES[case]
    unbroken = PPOTrainer(None, run_dir=tmp_path / "unbroken", overrides=overrides).fit()
    with pytest.raises(Interrupted, match="stopped by SIGTERM at iteration 3"):
        PPOTrainer(None, run_dir=tmp_path / "broken", overrides=overrides).fit(on_iteration=_stop_at(3))
    assert json.loads((tmp_path / "broken" / "summary.json").read_text())["status"] == "interrupted"
    assert (tmp_path / "broken" / "checkpoints" / "step-3").is_dir()
    resumed = PPOTrainer(None, run_dir=tmp_path / "broken", overrides=overrides).fit()

    assert resumed["status"] == unbroken["status"] == "completed" and resumed["global_step"] == 6
    assert _rows(tmp_path / "broken") == _rows(tmp_path / "unbroken")  # every figure of every iteration
    a, b = load_file(tmp_path / "unbroken" / "model.safetensors"), load_file(tmp_path / "broken" / "model.safetensors")
    assert all(a[k].equal(b[k]) for k in a) and a.keys() == b.keys()
    timing = {"env_steps_per_s"}
    assert {k: v for k, v in resumed["rl"].items() if k not in timing} == {
        k: v for k, v in unbroken["rl"].items() if k not in timing}


def test_a_complete_run_is_left_as_it_is(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    PPOTrainer(None, run_dir=run_dir, overrides=BASE).fit()
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    again = PPOTrainer(None, run_dir=run_dir, overrides=BASE).fit()
    assert again["status"] == "completed"
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_a_run_that_reached_its_target_return_is_complete(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [*BASE, "rl.total_timesteps=12800", "rl.stop_at_return=5"]  # any CartPole episode lasts 5 steps
    first = PPOTrainer(None, run_dir=run_dir, overrides=overrides).fit()
    assert first["status"] == "stopped_early" and first["rl"]["solved"] and first["global_step"] < 100
    assert first["rl"]["window_episodes"] == 100 and first["rl"]["episodic_return"] >= 5
    summary = (run_dir / "summary.json").read_bytes()
    assert PPOTrainer(None, run_dir=run_dir, overrides=overrides).fit()["status"] == "stopped_early"
    assert (run_dir / "summary.json").read_bytes() == summary


def test_a_checkpoint_of_other_environments_is_refused_whole(tmp_path: Path) -> None:
    PPOTrainer(None, run_dir=tmp_path / "eight", overrides=BASE).fit()
    checkpoint = tmp_path / "eight" / "checkpoints" / "step-6"
    other = PPOTrainer(None, run_dir=tmp_path / "four", overrides=[
        *BASE, "rl.num_envs=4", "rl.total_timesteps=384", f"checkpoint.resume={checkpoint}"])
    weights = {k: v.clone() for k, v in other.policy.state_dict().items()}
    with pytest.raises(CheckpointMismatch, match=r"physics is \[8, 4\] float64, this run's \[4, 4\] float64"):
        other.fit()
    assert all(weights[k].equal(v) for k, v in other.policy.state_dict().items())  # nothing was applied


def _as_written_before_the_rl_keys_moved(config_toml: Path, clip: float) -> None:
    """config.toml as gputrain wrote it before rl.learning_rate, rl.adam_eps and rl.max_grad_norm
    became optim.lr, optim.eps and train.clip_grad_norm: the [rl] keys (the clip at `clip`), and the
    shared keys at `gputrain train`'s defaults, which rl never read."""
    text = config_toml.read_text()
    text = re.sub(r"(?m)^lr = .*$", "lr = 0.001", text)
    text = re.sub(r"(?m)^eps = .*$", "eps = 1e-08", text)
    text = re.sub(r"(?m)^clip_grad_norm = .*\n", "", text)
    text = text.replace("[rl]\n", f'[rl]\nlearning_rate = "auto"\nadam_eps = 1e-05\nmax_grad_norm = {clip}\n')
    config_toml.write_text(text)


def test_a_run_written_before_the_rl_keys_moved_resumes_as_it_was_trained(tmp_path: Path) -> None:
    overrides = [*BASE, *CASES["cartpole"], "train.clip_grad_norm=0.05"]  # a clip that binds: it must come back
    PPOTrainer(None, run_dir=tmp_path / "unbroken", overrides=overrides).fit()
    with pytest.raises(Interrupted):
        PPOTrainer(None, run_dir=tmp_path / "broken", overrides=overrides).fit(on_iteration=_stop_at(3))
    _as_written_before_the_rl_keys_moved(tmp_path / "broken" / "config.toml", clip=0.05)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["rl", "--run-dir", str(tmp_path / "broken")])  # its own config.toml, as the advice says
    assert code == 0, err.getvalue()
    assert _rows(tmp_path / "broken") == _rows(tmp_path / "unbroken")  # the lr, eps and clip it was trained with
    a, b = load_file(tmp_path / "unbroken" / "model.safetensors"), load_file(tmp_path / "broken" / "model.safetensors")
    assert all(a[k].equal(b[k]) for k in a) and a.keys() == b.keys()
