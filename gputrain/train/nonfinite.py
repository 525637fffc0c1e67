"""Never apply a step whose loss or gradients are NaN/Inf: stop (default) or skip and count it.

This is the guard on the host, for where the device cannot skip an update itself (an optimizer
without a fused kernel, sharded parameters, pipeline stages, an fp16 GradScaler); elsewhere
device_guard.py keeps the same flag on the device. Here the decision has to be made before
`optimizer.step()`, and the LR scheduler (a host-side object) must not advance on a skipped step,
so the host reads ONE number per step, computed on the device. On steps that compute the gradient
norm anyway (clipping by norm, logging steps) it is the loss plus that norm; on the others it is
the flag of torch's fused AMP finiteness check over the gradients and the loss
(`_amp_foreach_non_finite_check_and_unscale_` with a scale of 1, one kernel per device and dtype,
three times cheaper than a norm on a small model). On CPU the read is free; on a GPU it stalls
kernel launch for the optimizer's kernels, the price torch's GradScaler pays every fp16 step.
`train.on_nonfinite=off` drops the check (a hand-written loop's behaviour).

fp16 with a GradScaler is different: Inf gradients there are routine (the loss scale is too high).
The scaler skips the update and lowers the scale itself; we only keep the LR schedule still. A
non-finite *loss* is never routine and is treated as above.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.distributed as dist

from gputrain.distributed.dtensor import is_dtensor, local_tensor
from gputrain.errors import RunError
from gputrain.observe.own_sync import own_sync

if TYPE_CHECKING:
    from gputrain.train.state import LoopState

log = logging.getLogger("gputrain")


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a step may be applied: "apply", "nonfinite" (NaN/Inf; `reason` says what and where),
    "overflow" (an fp16 loss-scale overflow, which the GradScaler handles itself) or "pending" (the
    device decided; the host reads it later, device_guard.py)."""

    kind: Literal["apply", "nonfinite", "overflow", "pending"]
    reason: str = ""


APPLY = Verdict("apply")  # the common verdict, built once: the hot path allocates nothing for it


@dataclass(frozen=True, slots=True)
class BadStep:
    """A step that was not applied: its number (1-based, as the run counts) and what was bad."""

    step: int
    verdict: Verdict


class NonFiniteStep(RunError):
    """A step produced NaN/Inf (train.on_nonfinite=stop). The parameters are those before the step."""

    @classmethod
    def at(cls, step: int, rank: int | None, verdict: Verdict) -> NonFiniteStep:
        where = f" (rank {rank})" if rank is not None else ""
        return cls(
            f"step {step}{where}: {verdict.reason}; the step was not applied and the parameters are "
            "those before it. Lower optim.lr, set train.clip_grad_norm, check the data, or set "
            "train.on_nonfinite=skip to skip such steps"
        )


def note_bad_steps(bad: list[BadStep], state: LoopState, mode: str, global_batch: int, rank: int | None) -> None:
    """What the loop does about steps that were not applied. In stop mode: raise NonFiniteStep at the
    first, with `state` set back to where that step began (the device guard masks every later
    update too, which the host had counted). In skip mode: count each and warn.

    The host guard's bad step is noted before the loop counts it; the device guard's once read."""
    if bad and mode == "stop":
        undone = state.global_step - (bad[0].step - 1)
        state.global_step -= undone
        state.step_in_epoch -= undone
        state.samples_seen -= undone * global_batch
        raise NonFiniteStep.at(bad[0].step, rank, bad[0].verdict)
    for skipped in bad:
        state.nonfinite_steps += 1
        log.warning(
            "step %d: %s; step skipped (%d so far)", skipped.step, skipped.verdict.reason, state.nonfinite_steps
        )


class NonFiniteGuard:
    """Decides, once per step, whether the step may be applied.

    Args:
        mode: "stop" (raise naming the step and rank) or "skip" (drop the step and count it).
        distributed: all-reduce the verdict so every rank skips (or stops) together; a rank that
            skipped alone would leave the replicas out of step for the rest of the run.
        scaler_active: an fp16 GradScaler owns Inf gradients (see module docstring).
    """

    def __init__(self, mode: str = "stop", *, distributed: bool = False, scaler_active: bool = False) -> None:
        self.mode = mode
        self.distributed = distributed
        self.scaler_active = scaler_active
        self._flags = FlagCheck()
        self._found: torch.Tensor | None = None  # made on the first check, on the loss's device; kept

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> Verdict:
        """The verdict for this step.

        The common case costs one add and one host sync: `loss + grad_norm` is finite exactly when
        both are (a norm is >= 0, so nothing cancels), and across ranks a SUM carries any rank's
        NaN/Inf to all of them. Only a bad step looks closer, to say what was bad and where.
        """
        total = loss.detach() if grad_norm is None else loss.detach() + grad_norm
        if self.distributed:
            total = total.float().clone()  # all_reduce works in place: never on the loss itself
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if math.isfinite(_read(total)):
            return APPLY
        return self._diagnose(loss, grad_norm)

    def check_gradients(self, loss: torch.Tensor, grads: list[torch.Tensor]) -> Verdict:
        """The verdict on a step that has no gradient norm: the same single sync, without a norm.

        A sharded (DTensor) gradient is checked on this rank's shard; another rank's bad shard
        reaches this one through the all-reduce.
        """
        if self._found is None:
            self._found = torch.zeros(1, device=loss.device)
        found = self._found
        self._flags.mark([*grads, loss.detach() if loss.requires_grad else loss], found)
        if self.distributed:
            dist.all_reduce(found, op=dist.ReduceOp.SUM)
        if _read(found) == 0:
            return APPLY
        found.zero_()
        return self._diagnose(loss, None, grads)

    def _diagnose(
        self, loss: torch.Tensor, grad_norm: torch.Tensor | None, grads: list[torch.Tensor] | None = None
    ) -> Verdict:
        bad_loss = not math.isfinite(float(loss.detach().float()))
        if grad_norm is None and grads:  # the rare bad step pays for a norm to say what was bad
            grad_norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.float()).cpu() for g in grads])
            )
        bad_grad = grad_norm is not None and not math.isfinite(float(grad_norm.float()))
        local = int(bad_loss) + 2 * int(bad_grad)  # bits: 1 = this rank's loss, 2 = its gradients
        any_loss, any_grad = bad_loss, bad_grad
        if self.distributed:  # how many ranks saw each kind (gradients are already synced under DDP)
            counts = torch.tensor([int(bad_loss), int(bad_grad)], device=loss.device, dtype=torch.int32)
            dist.all_reduce(counts, op=dist.ReduceOp.SUM)
            any_loss, any_grad = (bool(c) for c in counts.tolist())
        if any_grad and not any_loss and self.scaler_active:
            return Verdict("overflow", "fp16 loss scale overflow")
        return Verdict("nonfinite", self._describe(local, loss, grad_norm))

    @staticmethod
    def _describe(local: int, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> str:
        if local & 1:
            return f"loss is {_show(loss)}"
        if local & 2:
            return f"gradient norm is {_show(grad_norm)}"
        return "another rank saw a non-finite loss or gradient"


class FlagCheck:
    """Sets a flag tensor to 1 where any of a step's tensors holds a NaN/Inf, and never back to 0.

    One fused kernel where the tensors share a device and a dtype it has a kernel for (torch's
    `_amp_foreach_non_finite_check_and_unscale_` with a scale of exactly 1, which leaves every value
    unchanged); else one flag per device and dtype (`nonfinite_flags`), sharded (DTensor) tensors
    checked on this rank's shard. Which path fits is a property of the model, so it is decided once
    per number of tensors, not every step. Both guards use it: the host's reads the flag, the
    device's hands it to the optimizer.
    """

    def __init__(self) -> None:
        self._layout: tuple[int, bool] | None = None
        self._one = torch.ones(1)

    def mark(self, tensors: list[torch.Tensor], flag: torch.Tensor) -> None:
        if self._layout is None or self._layout[0] != len(tensors):
            device, dtype = flag.device, tensors[0].dtype
            uniform = amp_check_supports(device, dtype) and all(
                t.device == device and t.dtype == dtype and not is_dtensor(t) for t in tensors
            )
            self._layout = (len(tensors), uniform)
            self._one = torch.ones((), device=device)
        if self._layout[1]:
            torch._amp_foreach_non_finite_check_and_unscale_(tensors, flag, self._one)
            return
        for found in nonfinite_flags([local_tensor(t) for t in tensors]):
            flag.add_(found.to(flag.device).reshape(flag.shape))
        flag.clamp_(max=1.0)  # a flag, not a count: the fused optimizers skip on exactly 1


def _read(value: torch.Tensor) -> float:
    """The step's one host sync, labelled as ours for a profile."""
    with own_sync():
        return value.item()


# torch's fused finiteness check (`_amp_foreach_non_finite_check_and_unscale_`) by device type:
# its CUDA kernel has no bfloat16 implementation (pytorch#127176); the CPU kernel has one.
_AMP_CHECK_DTYPES = {
    "cuda": {torch.float32, torch.float64, torch.float16},
    "cpu": {torch.float32, torch.float64, torch.float16, torch.bfloat16},
}


def amp_check_supports(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the fused finiteness check runs on tensors of `dtype` on `device`."""
    return dtype in _AMP_CHECK_DTYPES.get(device.type, set())


def nonfinite_flags(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """One float flag per device and dtype: 1 where any element of `tensors` is NaN/Inf.

    The AMP kernel also multiplies every element by its scale; a scale of exactly 1 leaves each
    value, NaN and Inf unchanged, so the gradients are untouched. Where it has no kernel for a
    dtype (bf16 on CUDA), the per-tensor norms say the same: a norm is NaN or Inf exactly when
    the tensor holds a NaN or Inf (or finite values so large that their squares overflow, which
    no trainable step has).
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}  # a CUDA kernel takes one dtype
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    flags = []
    for (device, dtype), group in groups.items():
        if amp_check_supports(device, dtype):
            found = torch.zeros(1, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(group, found, torch.ones(1, device=device))
        else:
            total = torch.stack(torch._foreach_norm(group)).float().sum()
            found = (~torch.isfinite(total)).float().reshape(1)
        flags.append(found)
    return flags


def _show(value: torch.Tensor | None) -> str:
    if value is None:
        return "unknown"
    number = float(value.detach().float().item())
    return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf") if math.isinf(number) else str(number)
