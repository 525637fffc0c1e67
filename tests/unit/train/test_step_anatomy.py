"""The step's anatomy (benchmarks/step_anatomy.py): gputrain's real training step, counted on the CPU,
does no more than a hand loop with the same model, fused AdamW and compile scope: the same compiled
regions, frames, graphs and graph breaks, no recompile after step 2, no host sync on a non-logging
step, and no aten op beyond the documented handful (the non-finite guard's, the second parameter
group's). Issue 28's bug ("compile never ran": the FLOP counter's dispatch mode made dynamo run the
forwards eagerly for good) is put back on purpose below and must be caught, as must a graph break,
a sync and an extra op.

Tiny models, 6 steps each; a compiled case costs a few seconds of compiling on a CPU. ResNet-18
and the 2-layer GPT-2-shaped GPT run in the benchmark only (`python benchmarks/step_anatomy.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[3]


def _load() -> Any:
    name = "step_anatomy"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "step_anatomy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


anatomy = _load()
STEPS, LOG_EVERY = 6, 4  # steps 3, 5, 6 are quiet, step 4 logs


def _both(case: Any, compiled: bool) -> tuple[Any, Any]:
    hand = anatomy.measure(case, "hand", compiled, STEPS, LOG_EVERY)
    ours = anatomy.measure(case, "gputrain", compiled, STEPS, LOG_EVERY)
    return ours, hand


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", ["mlp", "gpt-tiny"])
def test_gputrain_step_does_no_more_than_the_hand_loop(name: str, compiled: bool) -> None:
    ours, hand = _both(anatomy.CASES[name](), compiled)
    assert anatomy.violations(ours, hand) == []
    if compiled:  # the counts are of compiled code that ran, in both loops
        assert hand.graphs >= 1 and hand.regions_per_step() >= 1
        # gputrain's own models compile whole: a graph break in one shows in both loops alike
        assert hand.breaks == ours.breaks == 0, ours.break_reasons
        # the whole model in one graph, as nanoGPT compiles it: one region a step, no eager code between blocks
        assert ours.graphs == hand.graphs == 1 and ours.regions_per_step() == hand.regions_per_step() == 1
    else:
        assert hand.frames == ours.frames == 0
    # a logging step reads the guard's flag, the loss and the gradient norm, no more: the counter
    # sees syncs where there are some
    assert ours.syncs(logging=True) == 3
    assert ours.syncs(logging=False) == 0 and hand.syncs(logging=False) == 0


@pytest.mark.parametrize("name", ["mlp", "gpt-tiny"])
def test_with_clipping_gputrain_clips_with_no_more_ops_than_clip_grad_norm(name: str) -> None:
    """train.clip_grad_norm against torch's `clip_grad_norm_` in the hand loop: the guard then checks
    loss + norm (one add) instead of every gradient."""
    case = anatomy.CASES[name]()
    hand = anatomy.measure(case, "hand", False, STEPS, LOG_EVERY, clip=1.0)
    ours = anatomy.measure(case, "gputrain", False, STEPS, LOG_EVERY, clip=1.0)
    assert anatomy.violations(ours, hand) == []
    assert "aten::_foreach_norm" in ours.quiet_step().ops  # it did clip


@pytest.mark.parametrize(("name", "compiled"), [("mlp", False), ("gpt-tiny", True)])
def test_under_bf16_autocast_too(name: str, compiled: bool) -> None:
    """train.precision=bf16 against the hand loop's own autocast: the same casts, the same extras."""
    case = anatomy.CASES[name]()
    hand = anatomy.measure(case, "hand", compiled, STEPS, LOG_EVERY, precision="bf16")
    ours = anatomy.measure(case, "gputrain", compiled, STEPS, LOG_EVERY, precision="bf16")
    assert anatomy.violations(ours, hand) == []
    if not compiled:  # autocast's casts are there, in both loops (the fp32 MLP step has no `to`)
        assert hand.quiet_step().ops["aten::to"] >= 4


@pytest.mark.parametrize(("name", "compiled"), [("mlp", False), ("gpt-tiny", True)])
def test_with_gradient_accumulation_too(name: str, compiled: bool) -> None:
    """train.grad_accum=2 against nanoGPT's accumulation (each micro-batch's loss / 2): the loss is
    scaled by a multiply where the hand loop divides, and summed on the device for the logged mean."""
    case = anatomy.CASES[name]()
    hand = anatomy.measure(case, "hand", compiled, STEPS, LOG_EVERY, accum=2)
    ours = anatomy.measure(case, "gputrain", compiled, STEPS, LOG_EVERY, accum=2)
    assert anatomy.violations(ours, hand) == []
    assert ours.quiet_step().ops["aten::detach"] >= 2  # two micro-batches ran
    if compiled:
        assert ours.regions_per_step() == hand.regions_per_step() == 2  # the whole model × 2 micro-batches


def test_dropout_costs_one_graph_more_on_the_first_step_only() -> None:
    """With random ops, the compile check (compile_check.py) decides a difference in eval mode: one
    frame and one graph more than the hand loop, compiled on step 1; the steps after run the same
    compiled regions and compile nothing."""
    case = anatomy._gpt_case("gpt-tiny-dropout", {"preset": "tiny", "dropout": 0.1}, seq_len=32, vocab=256, batch=4)
    ours, hand = _both(case, compiled=True)
    assert anatomy.violations(ours, hand) == [
        "frames: 2 against the hand loop's 1",
        "graphs: 2 against the hand loop's 1",
    ]
    assert (ours.steps[0].frames, ours.steps[0].graphs) == (2, 2)
    assert ours.regions_per_step() == hand.regions_per_step() == 1


def test_the_profile_counts_compiled_code_not_its_eager_twin() -> None:
    """Under a dispatch mode dynamo would run the compiled frame eagerly; the profiler leaves it compiled,
    so the compiled step dispatches fewer ops (inductor fused the rest) than the eager one."""
    case = anatomy.mlp_case()
    eager = anatomy.measure(case, "hand", False, STEPS, LOG_EVERY)
    compiled = anatomy.measure(case, "hand", True, STEPS, LOG_EVERY)
    assert compiled.ops_per_step() < eager.ops_per_step()
    assert "aten::relu" in eager.quiet_step().ops and "aten::relu" not in compiled.quiet_step().ops


# ------------------------------------------------------------------ mutations: each must be caught


def test_issue_28s_eager_fallback_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FLOP counter's dispatch mode without `force_eager`, as it was when the GPU run's compile
    never ran: the forwards stay eager after step 1."""
    from gputrain.observe.flops import StepFlopCounter

    @contextlib.contextmanager
    def counting_as_before(self: StepFlopCounter) -> Iterator[None]:
        with self._counting():
            yield

    monkeypatch.setattr(StepFlopCounter, "counting", counting_as_before)
    ours, hand = _both(anatomy.mlp_case(), compiled=True)
    found = anatomy.violations(ours, hand)
    assert any("compiled regions" in v for v in found), found


class _Breaks(nn.Module):
    """The MLP with a host read in its forward: a graph break, and a sync every step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net(x)
        if h.sum().item() > 1e30:  # never true: only the read matters
            h = h * 0
        return h


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_graph_break_and_a_sync_in_the_model_are_caught(compiled: bool) -> None:
    case = anatomy.mlp_case()
    broken = dataclasses.replace(case, make_model=anatomy._seeded(_Breaks))
    hand = anatomy.measure(case, "hand", compiled, STEPS, LOG_EVERY)
    ours = anatomy.measure(broken, "gputrain", compiled, STEPS, LOG_EVERY)
    found = anatomy.violations(ours, hand)
    assert any("syncs on non-logging steps" in v for v in found), found
    if compiled:
        assert any(v.startswith("breaks") for v in found), found


def test_an_extra_op_and_a_sync_in_the_step_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrain.train import step

    original = step.apply_update

    def with_more(parts: Any, loss: torch.Tensor, measure: bool, schedule: bool = True) -> Any:
        float(loss)  # a read of the loss every step
        return original(parts, loss * 1.0, measure, schedule)

    monkeypatch.setattr(step, "apply_update", with_more)
    ours, hand = _both(anatomy.mlp_case(), compiled=False)
    found = anatomy.violations(ours, hand)
    assert any("syncs on non-logging steps" in v for v in found), found
    assert any("ops beyond" in v and "aten::mul" in v for v in found), found


def test_compiling_block_by_block_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """gputrain's scope before issue 28: each block compiled, the embedding, final norm, head and the
    code between them eager (2 regions a step against 1, and their ops dispatched one by one)."""
    from gputrain.distributed import parallelize

    monkeypatch.setattr(parallelize, "compile_scope", lambda dims, choice: "blocks")
    ours, hand = _both(anatomy.CASES["gpt-tiny"](), compiled=True)
    found = anatomy.violations(ours, hand)
    assert "compiled regions run per step: 2 against the hand loop's 1 (a narrower scope)" in found
    assert any(v.startswith("ops beyond") and "aten::embedding" in v for v in found), found


def _event(name: str, start: int, end: int, parent: Any = None, device: str = "DeviceType.CPU") -> Any:
    import types

    return types.SimpleNamespace(
        name=name, time_range=types.SimpleNamespace(start=start, end=end), cpu_parent=parent, device_type=device
    )


def test_kernel_launches_are_counted_per_step_and_named_by_the_op_that_made_them() -> None:
    """The CUDA mode's count (`--device cuda`), on profiler events made by hand: a launch belongs to the
    step whose range holds it on the host, and is named by the outermost op or compiled region above it;
    a GPU's copy of a step range, and launches outside every step, count nowhere."""
    step = anatomy.STEP
    linear = _event("aten::linear", 12, 18)
    addmm = _event("aten::addmm", 13, 17, parent=linear)
    region = _event(anatomy.COMPILED_REGION, 30, 40)
    events = [
        _event(f"{step}:1", 10, 20),
        _event(f"{step}:2", 20, 50),
        _event(f"{step}:2", 0, 99, device="DeviceType.CUDA"),
        _event("cudaLaunchKernel", 14, 15, parent=addmm),
        _event("cudaLaunchKernel", 16, 17, parent=addmm),
        _event("cuLaunchKernel", 31, 32, parent=region),
        _event("cudaLaunchKernel", 45, 46),
        _event("cudaGraphLaunch", 47, 48),
        _event("cudaLaunchKernel", 60, 61),
        _event("cudaLaunchKernel", 20, 21),  # where step 1 ends and step 2 starts: step 2's
        _event("cudaMemcpyAsync", 15, 16),
    ]
    first, second = anatomy._launches(events, steps=2)
    assert first == {"aten::linear": 2}
    assert second == {anatomy.COMPILED_REGION: 1, "cudaLaunchKernel": 2, "cudaGraphLaunch": 1}


def test_host_waits_are_the_sync_debug_modes_per_call_warnings_only() -> None:
    """On a CPU the mode is not set (nothing is counted); the count takes only the per-call warning."""
    with anatomy._sync_warnings(torch.device("cpu")) as count:
        assert count() == 0
    assert "synchronizing" in anatomy.SYNC_WARNING
