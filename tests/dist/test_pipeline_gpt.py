"""The GPT cut into pipeline stages by ranges of blocks (models/gpt_parallel.py) trains exactly like
one process with every schedule, its tied embedding/head included; and composed with TP and FSDP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.dist.conftest import step_losses
from tests.dist.harness import run_ranks

GPT = ["model.name=gpt", "model.n_layer=4", "model.n_head=2", "model.d_model=16", "model.dropout=0.0",
       "data.name=synthetic", "data.task=lm", "data.seq_len=16", "data.vocab_size=64", "data.num_samples=256",
       "train.batch_size=16", "train.grad_accum=2", "train.max_steps=4", "train.epochs=1", "train.device=cpu",
       "optim.name=adamw", "optim.lr=0.01", "train.clip_grad_norm=0.5", "log.every_steps=1",
       "log.tensorboard=false", "log.progress=none", "checkpoint.enabled=false", "checkpoint.resume=never",
       "eval.every_epochs=0"]
SCHEDULES = {name: ["parallel.strategy=pp", f"parallel.pp_schedule={name}"]
             for name in ("gpipe", "1f1b", "interleaved_1f1b")}
FOUR_RANKS = {"pp_tp": ["parallel.strategy=hybrid", "parallel.pp=2", "parallel.tp=2", "parallel.dp_shard=1"],
              "pp_fsdp": ["parallel.strategy=hybrid", "parallel.pp=2", "parallel.dp_shard=2"]}


def _train(rank: int, runs: list[tuple[str, list[str]]]) -> None:
    from gputrain.train.trainer import Trainer

    for run_dir, overrides in runs:
        Trainer.from_config(None, run_dir=run_dir, overrides=GPT + overrides).fit()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from gputrain.train.trainer import Trainer

    root = tmp_path_factory.mktemp("pp_gpt")
    dirs = {name: root / name for name in ["single", *SCHEDULES, *FOUR_RANKS]}
    Trainer.from_config(None, run_dir=dirs["single"], overrides=[*GPT, "parallel.strategy=none"]).fit()
    run_ranks(_train, [(str(dirs[name]), o) for name, o in SCHEDULES.items()], timeout_s=300)
    run_ranks(_train, [(str(dirs[name]), o) for name, o in FOUR_RANKS.items()], world=4, timeout_s=300)
    return dirs


@pytest.mark.parametrize("case", [*SCHEDULES, *FOUR_RANKS])
def test_pipelined_gpt_matches_one_process(runs: dict[str, Path], case: str) -> None:
    expected, got = step_losses(runs["single"]), step_losses(runs[case])
    assert sorted(got) == [1, 2, 3, 4]
    torch.testing.assert_close(torch.tensor([got[s] for s in got]), torch.tensor([expected[s] for s in got]),
                               rtol=1e-5, atol=1e-5)
    ref = load_file(str(runs["single"] / "model.safetensors"))
    weights: dict[str, Any] = load_file(str(runs[case] / "model.safetensors"))
    # one process saves the tied matrix once; the stages hold it as wte (first) and lm_head (last)
    assert set(ref) <= set(weights) <= set(ref) | {"wte.weight", "lm_head.weight"}
    tied = ref.get("lm_head.weight", ref.get("wte.weight"))
    for key, value in weights.items():
        torch.testing.assert_close(value, ref.get(key, tied), rtol=1e-5, atol=1e-5, msg=f"{case}: {key}")
