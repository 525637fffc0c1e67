"""One optimizer step: forward and backward the micro-batches (`train_step`), then clip, guard,
step, zero the gradients and move the schedule (`apply_update`). No host-device sync in here with
the device-side guard (device_guard.py); the host guard reads one flag (nonfinite.py).

Trainer.fit → train_step → forward_backward, apply_update: the whole hot path is these functions,
and they answer with a `StepResult` (loss, gradient norm, verdict) rather than leaving state behind
on some object for the loop to find. A loop with its own backward (PPO's minibatches, rl/ppo.py)
calls `apply_update` after it, so every loop clips and guards alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gputrain.distributed.context import grad_sync
from gputrain.distributed.grad_norm import grad_norm_and_clip
from gputrain.observe.breakdown import StepTimer
from gputrain.precision import Precision
from gputrain.train.nonfinite import Guard, Verdict
from gputrain.train.token_loss import TokenNorm

ComputeLoss = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(slots=True)
class StepResult:
    loss: torch.Tensor
    """Mean loss over the step's micro-batches, on the device (read it on logging steps only); with
    token-level normalisation (token_loss.py) this rank's part of the mean over the global batch's
    valid tokens, which averaged over the ranks is that mean."""
    grad_norm: torch.Tensor | None
    """Global gradient L2 norm, on the device, where the step measured it (logging steps, clipping)."""
    verdict: Verdict
    """Whether the update was applied (see nonfinite.py)."""


@dataclass(slots=True)
class StepParts:
    model: nn.Module
    """The module the step calls (compiled / DDP-wrapped as configured)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    compute_loss: ComputeLoss | None = None
    """The loss of a micro-batch; None where the loop computes its losses itself and calls
    `apply_update` (PPO)."""
    clip_grad_norm: float | None = None
    clip_grad_value: float | None = None
    pipeline: Any = None
    """A `distributed.pp.PipelineRunner` when pipeline parallelism drives forward and backward."""
    pp_group: Any = None
    """The pipeline's process group: stages add up their gradient norms over it."""
    timer: StepTimer | None = None
    """Marks the step's parts on sampled steps (a no-op call on the others)."""
    guard: Guard = None  # type: ignore[assignment]  # None: train.on_nonfinite=off's, made below
    """Applies the update unless loss or gradients are NaN/Inf: decided on the host (one sync per
    step) or on the device (none; the verdict is PENDING until the loop calls `settle`), guard.py."""
    time_comm: bool = False
    """Time the data-parallel gradient communication apart from the backward pass (DDP, FSDP)."""
    params: list[torch.Tensor] | None = None
    """The parameters the optimizer updates, listed once (walking the module tree every step costs
    more than a tiny model's whole step); None: read from `model` each step."""
    tokens: TokenNorm | None = None
    """A language model's token losses normalised over the global batch's valid tokens
    (token_loss.py); None: each micro-batch's `compute_loss` is a mean, averaged over them."""
    persistent_grads: bool = False
    """Gradients live in buffers of their own, allocated once and zeroed after each step, and
    each micro-batch starts a new CUDA-graph step. Needed under CUDA graphs (train.cuda_graphs):
    a replayed backward writes its gradients into the graph's memory pool, and the next replay
    overwrites them, so `.grad` must never be that memory. With gradients accumulating into their
    own buffers, autograd adds each replay's output in place and lets the graph's memory go."""

    def __post_init__(self) -> None:
        if self.guard is None:
            self.guard = Guard(self.precision)
        if self.persistent_grads:
            for param in self.params if self.params is not None else self.model.parameters():
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)


def forward_backward(parts: StepParts, batch: Any, scale: float | torch.Tensor, sync_grads: bool) -> torch.Tensor:
    """Forward and backward one micro-batch. A mean loss (`compute_loss`) is scaled by 1/accumulation
    so the summed gradients equal those of the whole batch, and returned unscaled; a token-level
    one (`parts.tokens`) is the micro-batch's summed token loss times `scale` (a device tensor:
    dp_size / the global batch's valid tokens), returned scaled. Detached, on the device."""
    if parts.persistent_grads:  # under CUDA graphs: the outputs of the previous replay are no longer needed
        torch.compiler.cudagraph_mark_step_begin()
    with grad_sync(parts.model, sync_grads):
        with parts.precision.autocast():
            if parts.tokens is not None:
                loss = parts.tokens.loss.summed(parts.model, batch) * scale
            else:
                assert parts.compute_loss is not None, "a loop without compute_loss calls apply_update itself"
                loss = parts.compute_loss(parts.model, batch)
        timer = parts.timer if sync_grads and parts.time_comm else None
        if timer is not None and timer.active:
            timer.split_backward(loss)
        # a token loss is scaled above; a Python float is compared (never a tensor: that would sync)
        as_is = isinstance(scale, torch.Tensor) or scale == 1.0
        parts.precision.backward(loss if as_is else loss * scale)
        if timer is not None and timer.active:
            timer.mark("comm")
    return loss.detach()


def train_step(parts: StepParts, micro_batches: list[Any], measure_grad_norm: bool) -> StepResult:
    """Forward and backward every micro-batch, then apply one update (`apply_update`)."""
    n = len(micro_batches)
    if parts.tokens is not None:
        return _token_step(parts, parts.tokens, micro_batches, measure_grad_norm)
    loss_sum: torch.Tensor | None = None
    if parts.pipeline is not None:  # the schedule runs every micro-batch through the stages itself
        with parts.precision.autocast():
            loss_sum = parts.pipeline.step(micro_batches) * n
    for i, batch in enumerate(micro_batches if parts.pipeline is None else []):
        loss = forward_backward(parts, batch, 1.0 / n, sync_grads=i == n - 1)
        loss_sum = loss if loss_sum is None else loss_sum + loss
    assert loss_sum is not None
    if parts.timer is not None:
        parts.timer.mark("forward_backward")
    return apply_update(parts, loss_sum if n == 1 else loss_sum / n, measure_grad_norm)


def _token_step(parts: StepParts, tokens: TokenNorm, micro_batches: list[Any], measure_grad_norm: bool) -> StepResult:
    """`train_step` for token-level losses (token_loss.py): the global batch's valid tokens counted
    first (one all-reduce), each micro-batch's summed loss scaled by dp_size / that count (by the
    pipeline's schedule, with its loss_fn, where there is one)."""
    n = len(micro_batches)
    total = tokens.total(micro_batches)
    scale = tokens.scale(total)
    loss_sum: torch.Tensor | None = None
    if parts.pipeline is not None:
        # the schedule divides the gradients by n and returns the mean of its n losses: scaled by
        # n, they give the gradients of the terms above, and their mean is this rank's sum of them
        assert tokens.pipeline is not None, "a pipelined token loss is built with the schedule's loss_fn"
        tokens.pipeline.scale = scale * n
        with parts.precision.autocast():
            loss_sum = parts.pipeline.step(micro_batches)
        micro_batches = []
    for i, batch in enumerate(micro_batches):
        loss = forward_backward(parts, batch, scale, sync_grads=i == n - 1)
        loss_sum = loss if loss_sum is None else loss_sum + loss
    assert loss_sum is not None
    if parts.timer is not None:
        parts.timer.mark("forward_backward")
    return apply_update(parts, tokens.step_loss(loss_sum, total), measure_grad_norm)


def apply_update(parts: StepParts, loss: torch.Tensor, measure_grad_norm: bool, schedule: bool = True) -> StepResult:
    """The update from the gradients the backward passes left: unscale, clip, guard and step,
    zero the gradients, and move the LR schedule where the update was applied (`schedule=False`:
    the loop moves it itself, e.g. once per PPO iteration). `loss`: the step's mean loss, detached."""
    guard, grad_norm, params = parts.guard, None, []
    if parts.clip_grad_norm is not None or parts.clip_grad_value is not None or measure_grad_norm or guard.inspects:
        params = [p for p in (parts.params or parts.model.parameters()) if p.grad is not None]
        parts.precision.unscale(parts.optimizer)
        # the guard looks before value clipping, which would turn an Inf gradient into a finite one
        looks_first = guard.inspects and parts.clip_grad_value is not None
        if (measure_grad_norm or looks_first) and parts.clip_grad_norm is None:
            grad_norm = grad_norm_and_clip(params, None, parts.pp_group)
        if parts.clip_grad_value is not None:
            torch.nn.utils.clip_grad_value_(params, parts.clip_grad_value)
        if parts.clip_grad_norm is not None:
            grad_norm = grad_norm_and_clip(params, parts.clip_grad_norm, parts.pp_group)
    verdict = guard.step(parts.optimizer, loss, grad_norm, params)
    parts.optimizer.zero_grad(set_to_none=not parts.persistent_grads)
    if schedule and verdict.kind in ("apply", "pending"):  # a skipped step does not move the schedule
        parts.scheduler.step()
    if parts.timer is not None:
        parts.timer.mark("optimizer")
    return StepResult(loss, grad_norm, verdict)
