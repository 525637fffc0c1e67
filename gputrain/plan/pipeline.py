"""Pipeline parallelism measured stage by stage: each pp rank's stage that can need the most, cut
from the model as distributed/pp.py cuts it, run on fake tensors through its part of the schedule.

A stage's memory is not 1/pp of the model's: the cut is by whole layers (an MLP's widest layer may
be most of it), the first and last stages both hold a tied embedding/head matrix, and the schedule
decides how many micro-batches' activations a stage holds at once (1F1B: pp - stage on stage
`stage`, GPipe: all of them). So each stage is measured: two steps (the second measured) of its own
micro-batch order, with what torch.distributed.pipelining keeps beside the model: a receive buffer
per micro-batch for the activations coming in and one for the gradients coming back, the last
stage's outputs (kept for the step's result until the next step), the gradients sent back (kept on
the input buffers until then), and pp.py's exchange of the tied matrix's gradient. The step's input
batch is concatenated on every rank (pp.py), and counted so.

Interleaved 1F1B (two stages per rank) is not simulated: the caller falls back to the model in
layouts.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from gputrain.distributed.ac import ACMode, apply_ac
from gputrain.plan.measure import LossOf, MakeOptimizer, StepHarness, StepMemory, fake_batch, fake_copy, fake_mode

Autocast = Callable[[], contextlib.AbstractContextManager[Any]]


def schedule_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """This stage's forwards and backwards, in the order the schedule runs them: ("F" | "B", micro-batch)."""
    if schedule == "gpipe":
        return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
    warmup = min(micro_batches, stages - stage)  # torch's Schedule1F1B: the last stage warms up with 1
    order = [("F", i) for i in range(warmup)]
    forward, backward = warmup, 0
    while backward < micro_batches:
        order.append(("B", backward))
        backward += 1
        if forward < micro_batches:
            order.append(("F", forward))
            forward += 1
    return order


MEASURED_STAGES_MAX = 8
"""Stages measured one by one for a pp row, at most: beyond, the row is modelled (layouts.py), so a
plan's cost does not grow with the number of ranks. A block-stack model needs at most 4 (see
`stages_to_measure`); an nn.Sequential of different layers needs every stage."""
MEASURED_MICRO_BATCHES_MAX = 64
"""Micro-batches per step (train.grad_accum) a stage's schedule is run through, at most: a stage's
memory grows with them (a receive buffer each, all in flight under GPipe), so each is run; beyond,
the row is modelled, so a plan's cost does not grow with train.grad_accum."""


def _cut(model: nn.Module, stages: int, ids: list[int]) -> tuple[nn.Module, list[nn.Module], str | None]:
    """(this rank's holder, its stage modules `ids`, the name of its copy of a tied matrix) as pp.py cuts them."""
    from gputrain.distributed.pp import _cut_sequential, layer_units, split_units
    from gputrain.models.plans import pipeline_cut_for

    cut = pipeline_cut_for(model)
    if cut is not None:
        chunks, tied = cut[1](model, split_units(cut[0], stages), ids)
        return model, chunks, tied
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"pipeline parallelism does not cut {type(model).__name__}")
    units = layer_units(model)
    if len(units) < stages:
        raise ValueError("fewer layers than stages")
    return model, _cut_sequential(model, units, split_units(len(units), stages), ids), None


def stages_to_measure(model: nn.Module, stages: int) -> list[int]:
    """The stages whose memory can be the largest. A block-stack family (models/plans.py's cuts)
    is cut into stages of identical blocks: the first and last stages differ (embeddings, head,
    tied matrix), and of the stages between, those of one number of blocks differ only in the
    micro-batches the schedule keeps in flight, most on the earliest (1F1B: pp - stage; GPipe: all).
    So the first, the last and the earliest middle stage of each size decide the row. An
    nn.Sequential's layers differ: every stage."""
    from gputrain.distributed.pp import split_units
    from gputrain.models.plans import pipeline_cut_for

    cut = pipeline_cut_for(model)
    if cut is None:
        return list(range(stages))
    picked, sizes = [0, stages - 1], set()
    for stage, blocks in enumerate(split_units(cut[0], stages)[1:-1], start=1):
        if len(blocks) not in sizes:
            sizes.add(len(blocks))
            picked.append(stage)
    return sorted(set(picked))


def measure_pipeline(
    model: nn.Module,
    sample: Any,
    micro_batch: int,
    loss_of: LossOf,
    make_optimizer: MakeOptimizer,
    device: torch.device,
    stages: int,
    micro_batches: int,
    schedule: str = "1f1b",
    ac: ACMode = "none",
    autocast: Autocast = contextlib.nullcontext,
) -> list[StepMemory] | None:
    """The step memory of the stages that can need the most (`stages_to_measure`; stage i on pp
    rank i), on fake tensors; None where the model cannot be cut, the schedule is interleaved, the
    model does not run on fake tensors, or more than MEASURED_STAGES_MAX stages or
    MEASURED_MICRO_BATCHES_MAX micro-batches would be run."""
    if schedule not in ("1f1b", "gpipe") or stages < 2:
        return None
    measured = stages_to_measure(model, stages)
    if len(measured) > MEASURED_STAGES_MAX or micro_batches > MEASURED_MICRO_BATCHES_MAX:
        return None
    try:
        with fake_mode() as mode:
            inputs, targets = fake_batch(mode, sample, micro_batch, device)
            # every stage's input, from one copy cut into all stages: shapes only
            _, chain, _ = _cut(fake_copy(model, device), stages, list(range(stages)))
            stage_inputs = [inputs]
            with torch.no_grad(), autocast():
                for module in chain[: max(measured)]:
                    stage_inputs.append(module(stage_inputs[-1]))
            out: list[StepMemory] = []
            for stage in measured:
                holder, modules, tied = _cut(fake_copy(model, device), stages, [stage])
                module = apply_ac(modules[0], ac)
                first, last = stage == 0, stage == stages - 1
                out.append(
                    _measure_stage(
                        holder,
                        module,
                        stage_inputs[stage],
                        (inputs, targets),
                        first,
                        last,
                        tied if not (first and last) else None,
                        loss_of,
                        make_optimizer,
                        schedule_order(schedule, stage, stages, micro_batches),
                        micro_batches,
                        autocast,
                        micro_batch,
                    )
                )
            return out
    except Exception:  # noqa: BLE001 - the model's own code on fake tensors, or a cut it does not allow
        return None


def _measure_stage(
    holder: nn.Module,
    module: nn.Module,
    x: torch.Tensor,
    batch: tuple[torch.Tensor, torch.Tensor],
    first: bool,
    last: bool,
    tied: str | None,
    loss_of: LossOf,
    make_optimizer: MakeOptimizer,
    order: list[tuple[str, int]],
    micro_batches: int,
    autocast: Autocast,
    micro_batch: int,
) -> StepMemory:
    harness = StepHarness(holder, make_optimizer)
    tracker = harness.tracker
    inputs, targets = batch
    loop_batches = [(inputs.clone(), targets.clone()) for _ in range(micro_batches)]  # the loop's group
    tracker.track(tree_leaves(loop_batches), "inputs")
    received: list[torch.Tensor] = []
    grads_back: list[torch.Tensor] = []
    with harness, tracker:
        for step in range(2):
            tracker.reset_peak()
            if step == 1:
                tracker.start_recording()
            for buffer in received:  # the schedule's step start: last step's input gradients go
                buffer.grad = None
            outputs: list[Any] = []  # the last stage's outputs, kept for the step's result
            cache: dict[int, Any] = {}
            start = tracker.bytes["other"]
            saved = 0  # the most the forwards in flight keep at once
            # pp.py concatenates the step's micro-batches on every rank; the schedule splits them
            step_inputs = torch.cat([b[0] for b in loop_batches])
            step_targets = torch.cat([b[1] for b in loop_batches])
            if not first and not received:  # receive buffers: made once, kept for the run
                received = [torch.empty_like(x).requires_grad_() for _ in range(micro_batches)]
            for kind, i in order:
                if kind == "F":
                    xi = step_inputs.chunk(micro_batches)[i] if first else received[i]
                    with autocast():
                        if last:  # the schedule keeps each output until the next step
                            cache[i] = loss_of(_Keep(module, outputs), (xi, step_targets.chunk(micro_batches)[i]))
                        else:
                            cache[i] = module(xi)
                    if not last and not grads_back:
                        grads_back = [torch.empty_like(cache[i]) for _ in range(micro_batches)]
                    saved = max(saved, tracker.bytes["other"] - start)
                else:
                    value = cache.pop(i)
                    if last:
                        (value / micro_batches).backward()
                        for kept in tree_leaves(outputs[i]):
                            if isinstance(kept, torch.Tensor) and not kept._is_view():
                                kept.detach_()  # as the stage does: the graph goes, the output stays
                    else:
                        torch.autograd.backward(value, grads_back[i])
                    del value
            del cache
            if tied is not None:  # pp.py: the last stage's gradient of the tied matrix into the first's
                param = holder.get_parameter(tied)
                if first and param.grad is not None:
                    extra = torch.empty_like(param.grad)
                    param.grad.add_(extra)
                    del extra
                elif not first:
                    param.grad = None
            halves = harness.optimizer_half()
            del outputs
            if step == 1:
                return harness.result(
                    halves,
                    activations=saved,
                    micro_batch=micro_batch,
                    inputs=inputs.nbytes + targets.nbytes,
                    accum=micro_batches,
                )
    raise AssertionError("unreachable")


class _Keep(nn.Module):
    """Runs `module` and keeps its output in `sink` (the last stage's output chunks)."""

    def __init__(self, module: nn.Module, sink: list[Any]) -> None:
        super().__init__()
        self.module = module
        self.sink = sink

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*args, **kwargs)
        self.sink.append(out)
        return out
