"""The non-finite guard's `stop` mode with its verdict kept on the device: no host sync on a
non-logging step.

nonfinite.py's `NonFiniteGuard` reads one flag per step, which stalls a GPU's host every step so
it cannot run ahead of the device. Here the flag never leaves the device between logging steps:

- torch's fused optimizers (Adam, AdamW, SGD, Adagrad with `fused=True`) take a `found_inf`
  tensor and skip the whole update on the device when it is 1: no parameter, no moment and no
  step count changes (the mechanism GradScaler uses without a sync);
- the flag is *sticky*: once a step is bad, every later update is masked too, so when the host
  reads it on the next logging step (or before a checkpoint or an evaluation) the model is exactly
  as it was before the first bad step, which the run then names and stops at. The LR schedule
  stays on the host and moves every step; the loop sets it back with its step count on the stop.

The host reads the flag in `settle()`: one sync, on steps that sync anyway. `skip` mode stays on
the host (one read per step, nonfinite.py): it goes on after a bad step, so the masked steps
would have to be kept out of the LR schedule on the device. An earlier version did so (the
learning rate a device tensor looked up in a table of the schedule by the device's count of
applied steps, swapped into the optimizer's groups each step, and the scheduler's private state
rewritten on each read); that saved a GPU one read per step in a mode chosen for unreliable runs,
for the most intricate code of the step. The guard needs a fused optimizer over plain tensors and
no GradScaler (`fits`); elsewhere the host guard's one sync per step remains, and a profile says so.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.distributed as dist

from gputrain.distributed.dtensor import is_dtensor
from gputrain.observe.own_sync import own_sync
from gputrain.precision import Precision
from gputrain.train.nonfinite import PENDING, BadStep, FlagCheck, Guard, NonFiniteGuard, Verdict

MAX_WINDOW = 256
"""The most steps between two reads of the flag, whatever log.every_steps is: after a bad step the
device masks every update until the host reads the flag, so a run without logging steps still
stops within this many steps of the bad one."""


ON_CPU = False
"""Whether parameters on a CPU get the device-side guard too. They do not: there the host's read of
the flag waits for no device, and it costs ~11 us a step where the device guard's masked update
costs ~36 us (tiny MLP, `benchmarks/overhead_cpu.py`). Several ranks keep the device guard, whose
flags meet in one collective on logging steps. Tests set it to run the GPU's code path on CPU tensors."""


_FOUND_INF_STEPS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad)
"""The optimizers whose step (torch's own, not overridden) skips a fused update on `found_inf`."""


def fits(optimizer: torch.optim.Optimizer, mode: str, scaler_active: bool, distributed: bool = False) -> bool:
    """Whether the device-side guard can and should guard this run: `stop` mode, parameters on an
    accelerator (see ON_CPU), a fused optimizer of torch's (a user's subclass too, where it keeps
    torch's step) over plain tensors and no GradScaler (it owns `found_inf` itself); any other
    optimizer, a user's own class included, gets the host guard."""
    if mode != "stop" or scaler_active or not optimizer.defaults.get("fused"):
        return False
    # torch wraps each optimizer class's step in a profiling hook of its own: compare what is wrapped
    if not any(inspect.unwrap(type(optimizer).step) is inspect.unwrap(cls.step) for cls in _FOUND_INF_STEPS):
        return False  # a class of the user's with a `fused` setting of its own may not read found_inf
    first = next((p for group in optimizer.param_groups for p in group["params"]), None)
    if first is not None and first.device.type == "cpu" and not ON_CPU and not distributed:
        return False  # several CPU ranks keep the device guard: one collective at logging steps, not one a step
    # DTensor's fused-kernel rules do not take a plain found_inf tensor
    return not any(is_dtensor(p) for group in optimizer.param_groups for p in group["params"])


class DeviceGuard(Guard):
    """`stop` mode decided on the device; the host learns of it in `settle()`. `step` answers
    PENDING and applies the update, masked on the device once any step was bad.

    Args:
        precision: the run's precision (no GradScaler: `fits`).
        device: where the parameters are: the flag lives there.
        distributed: take the worst flag over all ranks, so every rank masks (and stops) together.
        window: the most steps between two `settle()` calls (the logging interval, at most MAX_WINDOW).
    """

    mode = "stop"
    inspects = True

    def __init__(self, precision: Precision, *, device: torch.device, distributed: bool, window: int) -> None:
        super().__init__(precision)
        self.distributed = distributed
        self.window = max(1, min(window, MAX_WINDOW))
        self._pending = 0  # steps since the last settle
        # one check per kind of call, so neither decides its kernel path again on every logging step
        self._norm_check, self._grads_check = FlagCheck(), FlagCheck()
        self._flag = torch.zeros((), device=device)  # sticky: 1 from the first bad step on
        self._bad = torch.zeros((), device=device)  # pending steps that ended masked
        self._first_loss = torch.zeros((), device=device)  # the loss of the first of them (what was bad)

    def step(
        self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_norm: torch.Tensor | None, params: list
    ) -> Verdict:
        """`optimizer.step()`, skipped on the device from the first step whose loss or gradients
        hold a NaN/Inf on (a norm is not finite exactly when a gradient is not)."""
        loss = loss.detach() if loss.requires_grad else loss  # the loop's loss is detached already
        if grad_norm is not None:
            self._norm_check.mark([(loss + grad_norm).float()], self._flag)  # sets, never resets: sticky
        else:
            self._grads_check.mark([*(p.grad for p in params if p.grad is not None), loss], self._flag)
        if self.distributed:
            dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        self._bad.add_(self._flag)
        torch.where(self._bad == 1, loss.float(), self._first_loss, out=self._first_loss)
        self._pending += 1
        # `found_inf` is no declared attribute of Optimizer: torch's fused step reads it where
        # GradScaler sets it (hence the ignores below)
        optimizer.found_inf = self._flag  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
        return PENDING

    @property
    def due(self) -> bool:
        return self._pending >= self.window

    def settle(self, last_step: int) -> list[BadStep]:
        """Read the flag (one sync): the first masked step since the last read, if any."""
        pending, self._pending = self._pending, 0
        if not pending:
            return []
        with own_sync():
            bad = int(self._bad.item())
            if not bad:
                return []
            loss = float(self._first_loss.item())
        self._flag.zero_()  # the run stops at this step: nothing later should see its flag
        self._bad.zero_()
        return [BadStep(last_step - bad + 1, Verdict("nonfinite", _reason(loss)))]

    def on_host(self) -> Guard:
        return NonFiniteGuard(self.mode, self.precision, distributed=self.distributed)


def _reason(loss: float) -> str:
    if not math.isfinite(loss):
        return f"loss is {'nan' if math.isnan(loss) else ('inf' if loss > 0 else '-inf')}"
    return "gradient norm is not finite"
