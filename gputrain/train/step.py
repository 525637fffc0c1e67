"""One optimizer step: accumulate micro-batches, clip, check, step. No host-device sync in here
with the device-side guard (device_guard.py); the host guard reads one flag (nonfinite.py).

Trainer.fit → train_step → forward_backward: the whole hot path is these two functions, and
`train_step` answers with a `StepResult` (loss, gradient norm, verdict) rather than leaving state
behind on some object for the loop to find.
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
from gputrain.train.device_guard import DeviceGuard
from gputrain.train.nonfinite import APPLY, NonFiniteGuard, Verdict

ComputeLoss = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(slots=True)
class StepResult:
    loss: torch.Tensor
    """Mean loss over the step's micro-batches, on the device (read it on logging steps only)."""
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
    compute_loss: ComputeLoss
    clip_grad_norm: float | None = None
    clip_grad_value: float | None = None
    pipeline: Any = None
    """A `distributed.pp.PipelineRunner` when pipeline parallelism drives forward and backward."""
    pp_group: Any = None
    """The pipeline's process group: stages add up their gradient norms over it."""
    timer: StepTimer | None = None
    """Marks the step's parts on sampled steps (a no-op call on the others)."""
    guard: NonFiniteGuard | DeviceGuard | None = None
    """Checks loss and gradients before the update: on the host (one sync per step) or on the
    device (none; the verdict is PENDING until the loop calls `settle`); None: no check."""
    time_comm: bool = False
    """Time the data-parallel gradient communication apart from the backward pass (DDP, FSDP)."""
    params: list[torch.Tensor] | None = None
    """The parameters the optimizer updates, listed once (walking the module tree every step costs
    more than a tiny model's whole step); None: read from `model` each step."""
    persistent_grads: bool = False
    """Gradients live in buffers of their own, allocated once and zeroed after each step, and
    each micro-batch starts a new CUDA-graph step. Needed under CUDA graphs (train.cuda_graphs):
    a replayed backward writes its gradients into the graph's memory pool, and the next replay
    overwrites them, so `.grad` must never be that memory. With gradients accumulating into their
    own buffers, autograd adds each replay's output in place and lets the graph's memory go."""

    def __post_init__(self) -> None:
        if self.persistent_grads:
            for param in self.params if self.params is not None else self.model.parameters():
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)


def forward_backward(parts: StepParts, batch: Any, scale: float, sync_grads: bool) -> torch.Tensor:
    """Forward and backward one micro-batch; the loss is scaled by 1/accumulation so the summed
    gradients equal those of the whole batch. Returns the unscaled loss, detached, on the device."""
    if parts.persistent_grads:  # under CUDA graphs: the outputs of the previous replay are no longer needed
        torch.compiler.cudagraph_mark_step_begin()
    with grad_sync(parts.model, sync_grads):
        with parts.precision.autocast():
            loss = parts.compute_loss(parts.model, batch)
        timer = parts.timer if sync_grads and parts.time_comm else None
        if timer is not None and timer.active:
            timer.split_backward(loss)
        parts.precision.backward(loss * scale if scale != 1.0 else loss)
        if timer is not None and timer.active:
            timer.mark("comm")
    return loss.detach()


def train_step(parts: StepParts, micro_batches: list[Any], measure_grad_norm: bool) -> StepResult:
    """Forward and backward every micro-batch, then clip, check and apply one update."""
    n = len(micro_batches)
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
    grad_norm = None
    guard = parts.guard
    verdict: Verdict | None = None if guard is not None else APPLY
    if parts.clip_grad_norm is not None or parts.clip_grad_value is not None or measure_grad_norm or guard is not None:
        params = [p for p in (parts.params or parts.model.parameters()) if p.grad is not None]
        parts.precision.unscale(parts.optimizer)
        # the guard looks before value clipping, which would turn an Inf gradient into a finite one
        if guard is not None and parts.clip_grad_norm is None:
            if measure_grad_norm:
                grad_norm = grad_norm_and_clip(params, None, parts.pp_group)
            else:  # no norm wanted this step: the cheaper flag check
                verdict = guard.check_gradients(loss_sum, [p.grad for p in params if p.grad is not None])
        if parts.clip_grad_value is not None:
            torch.nn.utils.clip_grad_value_(params, parts.clip_grad_value)
        if parts.clip_grad_norm is not None or (measure_grad_norm and grad_norm is None):
            grad_norm = grad_norm_and_clip(params, parts.clip_grad_norm, parts.pp_group)
    if verdict is None:
        assert guard is not None
        verdict = guard.check(loss_sum, grad_norm)
    if isinstance(guard, DeviceGuard):
        guard.step(parts.optimizer)  # masked on the device where the flag says; it moves the schedule too
    elif verdict.kind == "nonfinite":
        parts.precision.skip_step()  # the update never happens; the scaler (if any) still lowers its scale
    else:
        parts.precision.step(parts.optimizer)  # on "overflow" the GradScaler skips the update itself
    parts.optimizer.zero_grad(set_to_none=not parts.persistent_grads)
    if verdict.kind == "apply":  # a skipped step does not move the LR schedule
        parts.scheduler.step()
    if parts.timer is not None:
        parts.timer.mark("optimizer")
    return StepResult(loss_sum if n == 1 else loss_sum / n, grad_norm, verdict)
