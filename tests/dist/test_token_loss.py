"""A language model with -100 labels at uneven positions: 2 gloo ranks × 2 accumulation steps
train exactly as one process on the whole batch (weights after 3 steps and every logged loss, to
1e-6), under DDP and under FSDP, whose gradient reductions both average over the ranks
(train/token_loss.py); under tensor parallelism, whose two ranks read the same samples; a Hugging
Face GPT-2 on dict batches under DDP likewise (its forward given num_items_in_batch through the
wrapper); and 2 pipeline stages with 2 micro-batches (the schedule's loss scaled by the step's
count) as one process on a 2-layer GPT. With each micro-batch's own mean, as before, they do not.
About 30 s on 2 idle cores."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gputrain import Trainer
from tests.dist.harness import run_ranks
from tests.dist.token_jobs import token_runs
from tests.unit.train.test_token_loss import config, job_parts, step_losses

# run on 2 ranks -> (parallel.strategy, the model: test_token_loss.job_parts); each against one process
CASES = {
    "ddp": ("ddp", "gpt1"),
    "fsdp": ("fsdp", "gpt1"),
    "tp": ("tp", "gpt1"),  # the peers read the same samples: dp_size 1, no count exchanged
    "pp": ("pp", "gpt2"),
    "hf_ddp": ("ddp", "hf"),
}
EXTRA = {"pp": {"parallel.pp_schedule": "gpipe"}}  # two stages need two blocks: the 2-layer GPT


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("token_loss")
    kinds = sorted({kind for _, kind in CASES.values()})
    dirs = {name: root / name for name in (*CASES, *kinds)}
    for kind in kinds:  # the one-process reference of each model
        model, data, spec = job_parts(kind)
        Trainer(model, data, config=config(), run_dir=dirs[kind], spec=spec).fit()
    two = [
        (str(dirs[case]), {"parallel.strategy": strategy, "train.grad_accum": 2, **EXTRA.get(case, {})}, kind)
        for case, (strategy, kind) in CASES.items()
    ]
    normalised = run_ranks(token_runs, two, timeout_s=240)
    assert normalised == [[True] * len(CASES)] * 2  # both ranks, every run
    return dirs


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_times_two_accumulation_steps_equal_one_process(runs: dict[str, Path], case: str) -> None:
    single = runs[CASES[case][1]]
    expected, got = step_losses(single), step_losses(runs[case])
    assert len(expected) == len(got) == 3
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    ref, weights = load_file(single / "model.safetensors"), load_file(runs[case] / "model.safetensors")
    # one process saves a tied matrix once; pipeline stages hold it as wte (first) and lm_head (last)
    tied = ref.get("lm_head.weight", ref.get("wte.weight"))
    assert set(ref) <= set(weights) <= set(ref) | {"wte.weight", "lm_head.weight"}
    for key, value in weights.items():
        torch.testing.assert_close(value, ref.get(key, tied), rtol=1e-6, atol=1e-6, msg=f"{case}: {key}")
