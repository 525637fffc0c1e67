"""The plan against the CPU allocator's own peak in a real Trainer step (not the planner's step, not
its tracker): the check that fails when the planner drifts from what training really allocates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gputrain.cli.plan import build_plan_target
from gputrain.config import load_config
from gputrain.plan.allocator import AllocatorPeak, _report_flag
from benchmarks.peak_memory import measure_training_fresh
from gputrain.plan.planner import layout_row

TOLERANCE = 0.10  # the goal: within 10% of the measured peak
FP32 = ["train.device=cpu", "train.precision=fp32", "parallel.strategy=none"]
CASES = {
    "mlp": ["model.name=mlp", "train.batch_size=256"],
    "gpt-tiny": ["model.name=gpt", "model.preset=tiny", "data.name=synthetic", "data.task=lm", "train.batch_size=4"],
}


def planned(overrides: list[str], world: int = 1, strategy: str = "none", offload: bool = False) -> int:
    target, micro, _ = build_plan_target(load_config(None, overrides), world)
    row, measured = layout_row(target, micro, world, strategy, "none", offload, 1 << 50)
    assert measured
    return row.layout.total


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_is_within_10_percent_of_the_allocator_peak_of_a_trainer_step(case: str, tmp_path: Path) -> None:
    overrides = [*CASES[case], *FP32]
    measured = measure_training_fresh(overrides, str(tmp_path / "run"))  # a process nothing profiled before
    plan = planned(overrides)
    assert measured.resident > 0 and measured.peak > measured.resident
    assert abs(plan - measured.peak) <= TOLERANCE * measured.peak, (plan, measured)


def test_the_allocator_count_sees_other_threads() -> None:
    """What a dispatch-mode tracker (thread-local) cannot see, the allocator's count does: a tensor
    made on another thread (gloo's, under DDP and FSDP), freed on this one."""
    import threading

    held: list[torch.Tensor] = []
    flag = _report_flag()
    was = bool(flag.value)
    with AllocatorPeak() as tracker:
        thread = threading.Thread(target=lambda: held.append(torch.empty(1 << 20, dtype=torch.uint8)))
        thread.start()
        thread.join()
        tracker.mark()
        held.clear()
        tracker.mark()
    flag.value = was  # the rest of this session's tests run as they would
    assert tracker.live_at(1) - tracker.live_at(0) == 1 << 20
    assert tracker.live_at(2) == tracker.live_at(0)
    assert tracker.peak_between(0, 2) - tracker.live_at(0) >= 1 << 20
