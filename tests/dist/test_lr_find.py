"""`gputrain lr-find --nproc-per-node 2` (DDP over gloo): the ranks average each step's loss, so
every rank computes the same suggestion, and rank 0 alone prints it and writes lr_find.json. The
curve is the one-process curve where 2 ranks train as one process does (docs/distributed.md): a
model without dropout or batch normalisation, as the MLP here. With dropout (the default cnn) each
rank draws its own masks, the curve is equal in distribution only, and the command says so."""

from __future__ import annotations

import json

import numpy as np

from gputrain.config import load_config
from gputrain.train.lr_find import Sweep, build_sweep_parts, run_sweep, suggest_lr
from tests.conftest import run_cli

RUN = ["model.name=mlp", "train.device=cpu", "log.progress=none", "log.tensorboard=false", "checkpoint.enabled=false"]
SWEEP = ("--steps", "30", "--start-lr", "1e-5", "--end-lr", "1")


def test_two_ranks_sweep_the_one_process_curve_and_agree(tmp_path):
    """DDP on 2 ranks × 32 samples is the one-process batch of 64: the same curve, the same suggestion."""
    run_dir = tmp_path / "two"
    result = run_cli("lr-find", "--nproc-per-node", "2", "--run-dir", str(run_dir), *SWEEP, *RUN,
                     "parallel.strategy=ddp", "parallel.timeout_s=60")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("suggested optim.lr=") == 1 and "warning" not in result.stdout  # rank 0 speaks
    assert "note:" not in result.stdout  # nothing in the MLP makes 2 ranks differ from one process
    record = json.loads((run_dir / "lr_find.json").read_text())
    assert record["world_size"] == 2 and record["ranks_agreeing"] == 2  # each rank computed this very answer
    one = run_sweep(build_sweep_parts(load_config(None, RUN), tmp_path / "one"), Sweep(1e-5, 1.0, 30))
    assert np.allclose(record["losses"][:20], one.losses[:20], rtol=1e-4)
    assert record["suggested_lr"] == suggest_lr(one).lr
    assert [p.name for p in run_dir.iterdir()] == ["lr_find.json"]


def test_with_dropout_two_ranks_agree_and_say_the_curve_is_one_process_in_distribution_only(tmp_path):
    run_dir = tmp_path / "cnn"
    result = run_cli("lr-find", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--steps", "8",
                     "--start-lr", "1e-4", "--end-lr", "1e-2", "model.name=cnn", *RUN[1:],
                     "parallel.strategy=ddp", "parallel.timeout_s=60")
    assert result.returncode == 0, result.stderr
    assert ("note: the model has dropout, so 2 ranks sweep a curve equal to one process's in distribution, "
            "not point for point") in result.stdout
    assert json.loads((run_dir / "lr_find.json").read_text())["ranks_agreeing"] == 2
