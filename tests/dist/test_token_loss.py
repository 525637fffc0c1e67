"""A language model with -100 labels at uneven positions: 2 gloo ranks × 2 accumulation steps
train exactly as one process on the whole batch (weights after 3 steps and every logged loss, to
1e-6), under DDP and under FSDP, whose gradient reductions both average over the ranks
(train/token_loss.py); and 2 pipeline stages with 2 micro-batches (the schedule's loss scaled by
the step's count) as one process on a 2-layer GPT. With each micro-batch's own mean, as before,
they do not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gputrain import Trainer
from tests.dist.harness import run_ranks
from tests.dist.token_jobs import token_runs
from tests.unit.train.test_token_loss import SPEC, config, step_losses, tiny_gpt, uneven_data

STRATEGIES = ("ddp", "fsdp", "pp")
LAYERS = {"ddp": 1, "fsdp": 1, "pp": 2}  # two stages need two blocks
EXTRA = {"pp": {"parallel.pp_schedule": "gpipe"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("token_loss")
    dirs = {name: root / name for name in ("single", "single_2", *STRATEGIES)}
    for name, n_layer in (("single", 1), ("single_2", 2)):
        Trainer(tiny_gpt(n_layer), uneven_data(), config=config(), run_dir=dirs[name], spec=SPEC).fit()
    two = [
        (str(dirs[s]), {"parallel.strategy": s, "train.grad_accum": 2, **EXTRA.get(s, {})}, LAYERS[s])
        for s in STRATEGIES
    ]
    normalised = run_ranks(token_runs, two, timeout_s=240)
    assert normalised == [[True] * len(STRATEGIES)] * 2  # both ranks, every run
    return dirs


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_times_two_accumulation_steps_equal_one_process(runs: dict[str, Path], strategy: str) -> None:
    single = runs["single" if LAYERS[strategy] == 1 else "single_2"]
    expected, got = step_losses(single), step_losses(runs[strategy])
    assert len(expected) == len(got) == 3
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    ref, weights = load_file(single / "model.safetensors"), load_file(runs[strategy] / "model.safetensors")
    # one process saves a tied matrix once; pipeline stages hold it as wte (first) and lm_head (last)
    tied = ref.get("lm_head.weight", ref.get("wte.weight"))
    assert set(ref) <= set(weights) <= set(ref) | {"wte.weight", "lm_head.weight"}
    for key, value in weights.items():
        torch.testing.assert_close(value, ref.get(key, tied), rtol=1e-6, atol=1e-6, msg=f"{strategy}: {key}")
