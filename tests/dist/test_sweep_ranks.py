"""`gputrain sweep --nproc-per-node 2`: each trial is a 2-rank job started through train's launcher;
rank 0 reports the validation metric to the study, and a pruned trial's ranks agree on the stop
(the stop agreement), so both end at one step, the run stopped_early with stop_reason "pruned".

The order is certain without timing: the seeded sampler draws a good lr, then a hopeless one."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

pytest.importorskip("optuna", reason="gputrain sweep needs the optuna extra (pip install gputrain[optuna])")

SPACE = """
optim.lr = {choice = [1e-6, 1e-2]}
train.batch_size = {choice = [32, 64]}

[base]
model.name = "mlp"
data.name = "digits"
train.epochs = 100
train.max_steps = 12
eval.every_steps = 4
eval.every_epochs = 0
parallel.strategy = "ddp"
parallel.timeout_s = 60
log.tensorboard = false
"""


def test_a_two_rank_trial_reports_and_its_ranks_stop_together_when_pruned(tmp_path):
    (tmp_path / "space.toml").write_text(SPACE)
    # seed 1 draws (1e-2, 64), then (1e-6, 64)
    options = ["--trials", "2", "--sampler", "random", "--seed", "1", "--prune-startup", "1", "--prune-warmup", "5"]
    result = run_cli("sweep", "space.toml", "--nproc-per-node", "2", *options, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    sweep_dir = tmp_path / "runs" / "sweep-space"
    good, bad = (json.loads((sweep_dir / f"trial-000{n}" / "summary.json").read_text()) for n in (0, 1))
    assert good["world_size"] == bad["world_size"] == 2
    assert good["status"] == "completed" and good["global_step"] == 12
    # reported at step 8 (step 4 is within the warm-up); the ranks stop together by their next agreement
    assert bad["status"] == "stopped_early" and bad["stop_reason"] == "pruned" and 8 <= bad["global_step"] < 12
    assert f"trial 1: optim.lr=1e-06, train.batch_size=64: pruned at step {bad['global_step']}" in result.stdout
    metrics = [json.loads(line) for line in (sweep_dir / "trial-0001" / "metrics.jsonl").read_text().splitlines()]
    assert max(row["step"] for row in metrics) == bad["global_step"]
