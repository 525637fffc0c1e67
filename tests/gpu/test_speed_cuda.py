"""On CUDA: the guard's fused flag check, and the profiler's count of the user's syncs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gputrain import Trainer
from gputrain.data.tensors import TensorData
from gputrain.precision import Precision
from gputrain.train.nonfinite import NonFiniteGuard

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
QUIET = {"train.device": "cuda", "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False,
         "train.epochs": 1, "train.max_steps": 8, "train.batch_size": 32, "log.breakdown_every": 1}


@pytest.mark.parametrize("bad", [None, "fp32", "bf16", "loss"])
def test_flag_check_on_cuda_finds_bad_values_and_leaves_gradients_alone(bad: str | None) -> None:
    grads = [torch.randn(300, 7, device="cuda"), torch.randn(5, device="cuda", dtype=torch.bfloat16)]
    loss = torch.tensor(1.5, device="cuda")
    if bad == "fp32":
        grads[0][17, 3] = float("nan")
    elif bad == "bf16":
        grads[1][4] = float("inf")
    elif bad == "loss":
        loss = torch.tensor(float("inf"), device="cuda")
    before = [g.clone() for g in grads]
    assert NonFiniteGuard("skip", Precision("fp32", torch.device("cuda"))).check_gradients(loss, grads).kind == ("apply" if bad is None else "nonfinite")
    for old, new in zip(before, grads, strict=True):
        assert torch.equal(old.isnan(), new.isnan()) and torch.equal(old.nan_to_num(), new.nan_to_num())


def test_the_loops_own_syncs_are_not_the_users(tmp_path: Path) -> None:
    data = TensorData(torch.randn(512, 64), torch.randint(0, 4, (512,)))

    def with_item(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.item()
        return loss

    make = lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))  # noqa: E731
    ours = Trainer(make(), data, config=QUIET, run_dir=tmp_path / "ours").profile().facts
    users = Trainer(make(), data, step_fn=with_item, config=QUIET, run_dir=tmp_path / "users").profile()
    assert ours.syncs_per_step is not None and ours.syncs_per_step < 1
    assert users.facts.syncs_per_step is not None and users.facts.syncs_per_step >= 1
    assert "host sync every step" in [f.bottleneck for f in users.findings]
