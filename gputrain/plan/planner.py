"""The memory plan: one step measured on fake tensors, composed into every layout's per-device bytes,
and the layout `parallel.strategy=auto` takes (the first that fits, in the order of cost).

`PlanTarget` is what is measured (a model, one sample, the loss, the optimizer); `make_plan` gives
every row; `pick_layout` measures only as far as auto's choice needs (a run's start pays for one
fake step where the cheapest layout fits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gputrain.distributed.ac import ACMode
from gputrain.distributed.blocks import find_blocks
from gputrain.distributed.parallel_dims import Strategy
from gputrain.plan.layouts import STRATEGIES, LayoutBytes, ModelShape, layout_bytes, usable_bytes
from gputrain.plan.measure import LossOf, MakeOptimizer, Phase, StepMemory, measure_fake

AC_MODES: tuple[ACMode, ...] = ("none", "selective", "full")


@dataclass(slots=True)
class PlanTarget:
    """What one training step runs: measured on fake tensors at any micro-batch."""

    model: nn.Module
    sample: Any
    """One real sample as the step receives it: (inputs, targets), no batch dimension."""
    loss_of: LossOf
    make_optimizer: MakeOptimizer
    device: torch.device
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    param_bytes_factor: float = 1.0
    """Gathered parameters' bytes over stored (0.5 where FSDP gathers in bf16)."""
    accum: int = 1
    pp_schedule: str = "1f1b"
    optimizer_states: int = 2
    """fp32 tensors per parameter, for the estimate of a model that cannot run on fake tensors."""
    _cache: dict[tuple[int, str], StepMemory | None] = field(default_factory=dict)
    _stages: dict[tuple[int, int, str], list[StepMemory] | None] = field(default_factory=dict)

    def step(self, micro_batch: int, ac: ACMode = "none") -> StepMemory | None:
        """One step of `accum` micro-batches, measured on fake tensors (None: the model does not run on them)."""
        key = (micro_batch, ac)
        if key not in self._cache:
            self._cache[key] = measure_fake(
                self.model,
                self.sample,
                micro_batch,
                self.loss_of,
                self.make_optimizer,
                self.device,
                ac,
                self.autocast,
                self.accum,
            )
        return self._cache[key]

    def pipeline_stages(self, micro_batch: int, stages: int, ac: ACMode = "none") -> list[StepMemory] | None:
        """Each of `stages` pipeline stages measured through its part of the schedule (pipeline.py);
        None where that cannot be done (the layout is then modelled)."""
        from gputrain.plan.pipeline import measure_pipeline

        key = (micro_batch, stages, ac)
        if key not in self._stages:
            self._stages[key] = measure_pipeline(
                self.model,
                self.sample,
                micro_batch,
                self.loss_of,
                self.make_optimizer,
                self.device,
                stages,
                self.accum,
                self.pp_schedule,
                ac,
                self.autocast,
            )
        return self._stages[key]

    def step_or_states(self, micro_batch: int, ac: ACMode = "none") -> tuple[StepMemory, bool]:
        """(the measured step, True), or the states alone with no activations (False)."""
        measured = self.step(micro_batch, ac)
        if measured is not None:
            return measured, True
        n = sum(p.numel() * p.element_size() for p in self.model.parameters())
        opt = n * self.optimizer_states
        phase = Phase(3 * n + opt, n, 0, n, opt, 0)
        return StepMemory(n, 0, n, opt, 0, phase, phase, micro_batch), False

    def shape(self) -> ModelShape:
        blocks = find_blocks(self.model)
        sizes = sorted((sum(p.numel() * p.element_size() for p in b.parameters()) for _, b in blocks), reverse=True)
        total = sum(p.numel() * p.element_size() for p in self.model.parameters())
        largest = sizes[0] if sizes else total
        second = sizes[1] if len(sizes) > 1 else 0
        return ModelShape(largest, total - sum(sizes), bool(blocks), second)


@dataclass(frozen=True, slots=True)
class Row:
    layout: LayoutBytes
    fits: bool
    world: int


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    micro_batch: int
    world: int
    device_bytes: int
    rows: tuple[Row, ...]
    num_params: int
    measured: bool
    """False where the model could not run on fake tensors: activations left out."""
    auto: Row | None
    """The layout parallel.strategy=auto takes; None when nothing fits."""
    left_out: tuple[str, ...] = ()
    """The strategies the model cannot take on these ranks, each with why (feasible.py)."""

    @property
    def usable(self) -> int:
        return usable_bytes(self.device_bytes)


def auto_candidates(world: int) -> list[tuple[Strategy, ACMode]]:
    """auto's layouts in order of cost: replicas before shards, no recompute before recompute."""
    if world == 1:
        return [("none", "none"), ("none", "selective"), ("none", "full")]
    return [("ddp", "none"), ("fsdp", "none"), ("fsdp", "selective"), ("fsdp", "full")]


def layout_row(
    target: PlanTarget, micro: int, world: int, strategy: Strategy, ac: ACMode, offload: bool, device_bytes: int
) -> tuple[Row, bool]:
    """(the row, whether its activations were measured)."""
    step, measured = target.step_or_states(micro, ac)
    stages = target.pipeline_stages(micro, world, ac) if strategy == "pp" and measured and world > 1 else None
    layout = layout_bytes(
        step,
        target.shape(),
        strategy,
        world,
        ac=ac,
        offload=offload,
        accum=target.accum,
        pp_schedule=target.pp_schedule,
        param_bytes_factor=target.param_bytes_factor,
        stages=stages,
        host_is_device=target.device.type == "cpu",
    )
    return Row(layout, layout.total <= usable_bytes(device_bytes), world), measured


def pick_layout(target: PlanTarget, micro: int, world: int, device_bytes: int) -> tuple[Row, bool]:
    """The first of auto's candidates that fits (the last one, not fitting, if none does)."""
    row, measured = None, True
    for strategy, ac in auto_candidates(world):
        row, measured = layout_row(target, micro, world, strategy, ac, False, device_bytes)
        if row.fits:
            break
    assert row is not None
    return row, measured


def make_plan(target: PlanTarget, micro: int, world: int, device_bytes: int) -> MemoryPlan:
    """Every layout for `world` ranks (one device: `none` only) with and without checkpointing and
    offload; a strategy the model cannot take on `world` ranks is left out, and said why."""
    from gputrain.plan.feasible import row_problem

    rows: list[Row] = []
    left_out: list[str] = []
    measured = True
    strategies = STRATEGIES if world > 1 else ("none",)
    for strategy in strategies:
        problem = row_problem(target.model, strategy, world, target.pp_schedule)
        if problem is not None:
            left_out.append(f"{strategy} on {world} ranks: {problem}")
            continue
        for ac in AC_MODES:
            for offload in (False, True) if strategy in ("fsdp", "hybrid") else (False,):
                row, ok = layout_row(target, micro, world, strategy, ac, offload, device_bytes)
                rows.append(row)
                measured = measured and ok
    auto, _ = pick_layout(target, micro, world, device_bytes)
    return MemoryPlan(
        micro_batch=micro,
        world=world,
        device_bytes=device_bytes,
        rows=tuple(rows),
        num_params=sum(p.numel() for p in target.model.parameters()),
        measured=measured,
        auto=auto if auto.fits else None,
        left_out=tuple(left_out),
    )
