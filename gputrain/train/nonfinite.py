"""Never apply a step whose loss or gradients are NaN/Inf: stop (default) or skip and count it.

The guard is one object whatever train.on_nonfinite says, and the update asks it once:
`guard.step(optimizer, loss, grad_norm, params)` applies the optimizer's step or not and answers a
`Verdict`; the loop calls `guard.settle(step)` on the steps that sync anyway (and when `guard.due`),
which names the steps a device-side guard masked. `Guard` itself is `train.on_nonfinite=off`: every
update applied, nothing checked (a hand-written loop's behaviour). guard.py picks the guard.

This module's `NonFiniteGuard` decides on the host: for `skip` mode, and for `stop` where the
device cannot skip an update itself (an optimizer without a fused kernel, sharded parameters,
pipeline stages, an fp16 GradScaler, a CPU); elsewhere device_guard.py keeps `stop`'s flag on the
device. Here the decision has to be made before `optimizer.step()`, and the LR scheduler (a
host-side object) must not advance on a skipped step, so the host reads ONE number per step,
computed on the device. On steps that compute the gradient norm anyway (clipping by norm, logging
steps) it is the loss plus that norm; on the others it is the flag of torch's fused AMP finiteness
check over the gradients and the loss (`_amp_foreach_non_finite_check_and_unscale_` with a scale
of 1, one kernel per device and dtype, three times cheaper than a norm on a small model). On CPU
the read is free; on a GPU it stalls kernel launch for the optimizer's kernels, the price torch's
GradScaler pays every fp16 step.

fp16 with a GradScaler is different: Inf gradients there are routine (the loss scale is too high).
The scaler skips the update and lowers the scale itself; we only keep the LR schedule still. A
non-finite *loss* is never routine and is treated as above.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.distributed as dist

from gputrain.distributed.dtensor import is_dtensor, local_tensor
from gputrain.errors import RunError
from gputrain.observe.own_sync import own_sync

if TYPE_CHECKING:
    from gputrain.precision import Precision
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
PENDING = Verdict("pending")
"""A device-side verdict the host has not read yet (`DeviceGuard.settle` reads it)."""


@dataclass(frozen=True, slots=True)
class BadStep:
    """A step that was not applied: its number (1-based, as the run counts) and what was bad."""

    step: int
    verdict: Verdict


class NonFiniteStep(RunError):
    """A step produced NaN/Inf (train.on_nonfinite=stop). The parameters are those before the step."""

    @classmethod
    def at(cls, where: str, rank: int | None, verdict: Verdict) -> NonFiniteStep:
        """`where`: the step as the loop names it ("step 5", "iteration 3, update 2")."""
        on = f" (rank {rank})" if rank is not None else ""
        return cls(
            f"{where}{on}: {verdict.reason}; the step was not applied and the parameters are "
            "those before it. Lower optim.lr, set train.clip_grad_norm, check the data, or set "
            "train.on_nonfinite=skip to skip such steps"
        )


def note_bad_steps(
    bad: list[BadStep],
    state: LoopState,
    mode: str,
    rank: int | None,
    *,
    unit: str = "step",
    name: Callable[[int], str] | None = None,
    undo: Callable[[int], None] | None = None,
) -> None:
    """What a loop does about steps that were not applied. In stop mode: `undo(first bad step)`
    (set the loop back to where that step began: the device guard masks every later update too,
    which the loop had counted), then raise NonFiniteStep naming it. In skip mode: count each in
    `state.nonfinite_steps` and warn. `name` says a step's number as the loop counts (default
    "step 5"); `unit` what was skipped."""
    say = name or f"{unit} {{}}".format
    if bad and mode == "stop":
        if undo is not None:
            undo(bad[0].step)
        raise NonFiniteStep.at(say(bad[0].step), rank, bad[0].verdict)
    for skipped in bad:
        state.nonfinite_steps += 1
        log.warning(
            "%s: %s; %s skipped (%d so far)", say(skipped.step), skipped.verdict.reason, unit, state.nonfinite_steps
        )


class Guard:
    """train.on_nonfinite=off: every update is applied and nothing is checked. The base of the
    guards: the loop asks any guard the same questions (`step`, `due`, `settle`, `on_host`)."""

    mode = "off"
    inspects = False
    """Whether `step` reads the gradients: the update unscales them first (fp16)."""

    def __init__(self, precision: Precision) -> None:
        self.precision = precision

    def step(
        self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_norm: torch.Tensor | None, params: list
    ) -> Verdict:
        """Apply the update unless the step is bad. `grad_norm`: the step's gradient norm where the
        update measured one (else the guard looks at the gradients of `params` itself)."""
        self.precision.step(optimizer)
        return APPLY

    @property
    def due(self) -> bool:
        """Whether `settle` must run before another step (the device guard's window is used up)."""
        return False

    def settle(self, last_step: int) -> list[BadStep]:
        """The steps since the last call that were not applied but not yet reported (only a
        device-side guard has any: one host read). `last_step` numbers the latest step taken."""
        return []

    def on_host(self) -> Guard:
        """This guard deciding every step on the host (what a loop that reads every step wants)."""
        return self


class NonFiniteGuard(Guard):
    """Decides, once per step on the host, whether the step may be applied.

    Args:
        mode: "stop" (raise naming the step and rank) or "skip" (drop the step and count it).
        precision: applies the update (with its GradScaler, if any: it owns Inf gradients, see the
            module docstring).
        distributed: all-reduce the verdict so every rank skips (or stops) together; a rank that
            skipped alone would leave the replicas out of step for the rest of the run.
    """

    inspects = True

    def __init__(self, mode: str, precision: Precision, *, distributed: bool = False) -> None:
        super().__init__(precision)
        self.mode = mode
        self.distributed = distributed
        self._flags = FlagCheck()
        self._found: torch.Tensor | None = None  # made on the first check, on the loss's device; kept

    @property
    def scaler_active(self) -> bool:
        return self.precision.scaler is not None

    def step(
        self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_norm: torch.Tensor | None, params: list
    ) -> Verdict:
        if grad_norm is not None:
            verdict = self.check(loss, grad_norm)
        else:  # no norm wanted this step: the cheaper flag check
            verdict = self.check_gradients(loss, [p.grad for p in params if p.grad is not None])
        if verdict.kind == "nonfinite":
            self.precision.skip_step()  # the update never happens; the scaler (if any) still lowers its scale
        else:
            self.precision.step(optimizer)  # on "overflow" the GradScaler skips the update itself
        return verdict

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
