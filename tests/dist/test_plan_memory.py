"""The plan's rows for 2 ranks against each real gloo rank's peak, read from the CPU allocator in a real
Trainer step: FSDP (sharded states, the gathered and prefetched layers, the unsharded gradient before
its reduce-scatter), FSDP with CPUOffloadPolicy (parallel.cpu_offload: on a CPU job the host's memory is
the device's, so the row counts the shards it would offload, as the allocator does) and PP (stages cut
by whole layers: this MLP's widest layer is most of the model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dist.harness import run_ranks

TOLERANCE = 0.10
MLP_WIDE = ["model.name=mlp", "model.hidden_sizes=[1024,1024]", "train.batch_size=64", "train.device=cpu",
            "train.precision=fp32"]
CASES = {
    "fsdp": [*MLP_WIDE, "parallel.strategy=fsdp"],
    "fsdp-offload": [*MLP_WIDE, "parallel.strategy=fsdp", "parallel.cpu_offload=true"],
    "pp": [*MLP_WIDE, "parallel.strategy=pp", "parallel.pp=2", "train.grad_accum=2"],
}


def _measure(rank: int, overrides: list[str], run_dir: str) -> int:
    from benchmarks.peak_memory import measure_training

    return measure_training(overrides, run_dir).peak


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_two_rank_plan_is_within_10_percent_of_each_ranks_allocator_peak(strategy: str, tmp_path: Path) -> None:
    from tests.unit.plan.test_plan_vs_allocator import planned

    overrides = CASES[strategy]
    peaks = run_ranks(_measure, overrides, str(tmp_path / "run"), timeout_s=120)
    offload = "parallel.cpu_offload=true" in overrides
    plan = planned(overrides, world=2, strategy=strategy.split("-")[0], offload=offload)
    worst = max(peaks)
    assert abs(plan - worst) <= TOLERANCE * worst, (plan, peaks)
