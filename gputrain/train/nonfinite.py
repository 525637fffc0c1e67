"""Never apply a step whose loss or gradients are NaN/Inf: stop (default) or skip and count it.

Design: the decision has to be made before `optimizer.step()`, and the LR scheduler (a host-side
object) must not advance on a skipped step, so the host has to know the answer every step. We
therefore pay exactly ONE host-device sync per step: a single boolean computed on the device from
the loss and the gradient norm (itself one fused `get_total_norm` reduction, reused for logging
and clipping). The alternative, applying the update conditionally on the device, only works for
fused optimizers (their `found_inf` argument), cannot keep a host-side scheduler exact without a
sync anyway, and needs a copy of every parameter and optimizer state for the others. On CPU the
sync is free; on a GPU it stalls kernel launch for the optimizer's few (fused/foreach) kernels —
the same price torch's GradScaler already pays every fp16 step. Measured cost: docs/reliability.md.

fp16 with a GradScaler is different: Inf gradients there are routine (the loss scale is too high).
The scaler skips the update and lowers the scale itself; we only keep the LR schedule still. A
non-finite *loss* is never routine and is treated as above.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.distributed as dist

from gputrain.errors import RunError

Verdict = Literal["apply", "nonfinite", "overflow"]


class NonFiniteStep(RunError):
    """A step produced NaN/Inf (train.on_nonfinite=stop). The parameters are those before the step."""


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
        self.last: Verdict = "apply"
        self.last_reason = ""

    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> Verdict:
        """Return and remember the verdict for this step.

        The common case costs one add and one host sync: `loss + grad_norm` is finite exactly when
        both are (a norm is >= 0, so nothing cancels), and across ranks a SUM carries any rank's
        NaN/Inf to all of them. Only a bad step looks closer, to say what was bad and where.
        """
        total = loss.detach() if grad_norm is None else loss.detach() + grad_norm
        if self.distributed:
            total = total.float().clone()  # all_reduce works in place: never on the loss itself
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if math.isfinite(total.item()):
            self.last, self.last_reason = "apply", ""
            return self.last
        return self._diagnose(loss, grad_norm)

    def _diagnose(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> Verdict:
        bad_loss = not math.isfinite(float(loss.detach().float()))
        bad_grad = grad_norm is not None and not math.isfinite(float(grad_norm.float()))
        local = int(bad_loss) + 2 * int(bad_grad)  # bits: 1 = this rank's loss, 2 = its gradients
        any_loss, any_grad = bad_loss, bad_grad
        if self.distributed:  # how many ranks saw each kind (gradients are already synced under DDP)
            counts = torch.tensor([int(bad_loss), int(bad_grad)], device=loss.device, dtype=torch.int32)
            dist.all_reduce(counts, op=dist.ReduceOp.SUM)
            any_loss, any_grad = (bool(c) for c in counts.tolist())
        if any_grad and not any_loss and self.scaler_active:
            self.last, self.last_reason = "overflow", "fp16 loss scale overflow"
        else:
            self.last = "nonfinite"
            self.last_reason = self._describe(local, loss, grad_norm)
        return self.last

    @staticmethod
    def _describe(local: int, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> str:
        if local & 1:
            return f"loss is {_show(loss)}"
        if local & 2:
            return f"gradient norm is {_show(grad_norm)}"
        return "another rank saw a non-finite loss or gradient"

    def error(self, step: int, rank: int | None) -> NonFiniteStep:
        where = f" (rank {rank})" if rank is not None else ""
        return NonFiniteStep(f"step {step}{where}: {self.last_reason}; the step was not applied and the "
                             "parameters are those before it. Lower optim.lr, set train.clip_grad_norm, "
                             "check the data, or set train.on_nonfinite=skip to skip such steps")


def _show(value: torch.Tensor | None) -> str:
    if value is None:
        return "unknown"
    number = float(value.detach().float().item())
    return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf") if math.isinf(number) else str(number)
