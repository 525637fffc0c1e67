"""A language model with -100 labels at uneven positions: 2 gloo ranks × 2 accumulation steps
train exactly as one process on the whole batch (weights after 3 steps and every logged loss, to
1e-6), under DDP and under FSDP, whose gradient reductions both average over the ranks
(train/token_loss.py). With each micro-batch's own mean, as before, they do not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gputrain import Trainer
from tests.dist.harness import run_ranks
from tests.dist.token_jobs import token_runs
from tests.unit.train.test_token_loss import SPEC, config, step_losses, tiny_gpt, uneven_data

STRATEGIES = ("ddp", "fsdp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("token_loss")
    dirs = {name: root / name for name in ("single", *STRATEGIES)}
    Trainer(tiny_gpt(), uneven_data(), config=config(), run_dir=dirs["single"], spec=SPEC).fit()
    two = [(str(dirs[s]), {"parallel.strategy": s, "train.grad_accum": 2}) for s in STRATEGIES]
    normalised = run_ranks(token_runs, two, timeout_s=240)
    assert normalised == [[True, True], [True, True]]  # both ranks, both runs
    return dirs


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_times_two_accumulation_steps_equal_one_process(runs: dict[str, Path], strategy: str) -> None:
    expected, got = step_losses(runs["single"]), step_losses(runs[strategy])
    assert len(expected) == len(got) == 3
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    ref, weights = load_file(runs["single"] / "model.safetensors"), load_file(runs[strategy] / "model.safetensors")
    assert weights.keys() == ref.keys()
    for key in ref:
        torch.testing.assert_close(weights[key], ref[key], rtol=1e-6, atol=1e-6, msg=f"{strategy}: {key}")
