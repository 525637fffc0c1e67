"""The non-finite guard with its verdict kept on the device: no host sync on a non-logging step.

nonfinite.py's `NonFiniteGuard` reads one flag per step, which stalls a GPU's host every step so
it cannot run ahead of the device. Here the flag never leaves the device between logging steps:

- torch's fused optimizers (Adam, AdamW, SGD, Adagrad with `fused=True`) take a `found_inf`
  tensor and skip the whole update on the device when it is 1: no parameter, no moment and no
  step count changes (the mechanism GradScaler uses without a sync);
- `stop` mode keeps that flag *sticky*: once a step is bad, every later update is masked too, so
  when the host reads the flag on the next logging step (or before a checkpoint or an evaluation)
  the model is exactly as it was before the first bad step, which the run then names and stops at.
  The LR schedule stays on the host: every applied step precedes the first bad one, so the host's
  count of steps is the schedule's position for all of them, and it is set back on the stop;
- `skip` mode has to keep going with an exact schedule, so the learning rate becomes a device
  tensor read from a table of the schedule indexed by the device's count of applied steps; the
  host's scheduler is moved to that count whenever the host reads the flags.

The host reads the flags in `settle()`: one sync, on steps that sync anyway. The guard needs a
fused optimizer over plain tensors and no GradScaler (`fits`); elsewhere the host guard's one
sync per step remains, and a profile says so.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from gputrain.distributed.dtensor import is_dtensor
from gputrain.observe.own_sync import own_sync
from gputrain.train.nonfinite import BadStep, FlagCheck, Verdict

PENDING = Verdict("pending")
"""A device-side verdict the host has not read yet (`DeviceGuard.settle` reads it)."""

MAX_WINDOW = 256
"""The most steps between two reads of the flags, whatever log.every_steps is: a read every 256
steps costs nothing, and the per-step buffers stay small."""
MAX_TABLE_STEPS = 1_000_000
"""Skip mode tabulates the schedule, one float per step (4 MB and ~0.5 s to build at this size);
a longer run keeps the host guard."""


ON_CPU = False
"""Whether parameters on a CPU get the device-side guard too. They do not: there the host's read of
the flag waits for no device, and it costs ~11 us a step where the device guard's masked update
costs ~36 us (tiny MLP, `benchmarks/overhead_cpu.py`). Several ranks keep the device guard, whose
flags meet in one collective on logging steps. Tests set it to run the GPU's code path on CPU tensors."""


def fits(
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    mode: str,
    scaler_active: bool,
    total_steps: int,
    distributed: bool = False,
) -> bool:
    """Whether the device-side guard can and should run this step: parameters on an accelerator (see
    ON_CPU), a fused optimizer over plain tensors, no GradScaler (it owns `found_inf` itself), and in
    `skip` mode a schedule it can tabulate."""
    if mode not in ("stop", "skip") or scaler_active or not optimizer.defaults.get("fused"):
        return False
    first = next((p for group in optimizer.param_groups for p in group["params"]), None)
    if first is not None and first.device.type == "cpu" and not ON_CPU and not distributed:
        return False  # several CPU ranks keep the device guard: one collective at logging steps, not one a step
    if any(is_dtensor(p) for group in optimizer.param_groups for p in group["params"]):
        return False  # DTensor's fused-kernel rules do not take a plain found_inf tensor
    return mode == "stop" or (isinstance(scheduler, LambdaLR) and total_steps <= MAX_TABLE_STEPS)


class DeviceGuard:
    """Decides on the device whether each step is applied; the host learns of it in `settle()`.

    `check` and `check_gradients` take the host guard's arguments (nonfinite.py) and answer PENDING;
    `step` applies the update, masked on the device where the flag says so.

    Args:
        mode: "stop" or "skip" (train.on_nonfinite).
        scheduler: the run's LR schedule (stepped here in stop mode, tabulated in skip mode).
        device: where the parameters are: the flags and the per-step buffers live there.
        distributed: take the worst flag over all ranks, so every rank masks (or stops) together.
        window: the most steps between two `settle()` calls (the logging interval, at most
            MAX_WINDOW); the loss of each of them is kept on the device to say what was bad.
        total_steps: the run's length, the extent of skip mode's table of the schedule.
    """

    def __init__(
        self,
        mode: str,
        scheduler: LRScheduler,
        *,
        device: torch.device,
        distributed: bool,
        window: int,
        total_steps: int,
    ) -> None:
        self.mode = mode
        self.scheduler = scheduler
        self.total_steps = total_steps
        self.distributed = distributed
        self.window = max(1, min(window, MAX_WINDOW))
        self._pending = 0  # steps since the last settle
        # one check per kind of call, so neither decides its kernel path again on every logging step
        self._norm_check, self._grads_check = FlagCheck(), FlagCheck()
        self._flag = torch.zeros((), device=device)  # stop: sticky; skip: this step's
        self._losses = torch.zeros(self.window, device=device)
        self._flags = torch.zeros(self.window, device=device)  # skip: each pending step's flag
        # views made once: indexing a tensor every step is one more dispatch than copying into a view
        self._loss_slots, self._flag_slots = self._losses.unbind(), self._flags.unbind()
        self._bad = torch.zeros((), device=device)  # stop: pending steps that ended masked
        self._tables: list[torch.Tensor] = []  # skip: each group's LR at every position of the schedule
        if mode == "skip":
            assert isinstance(scheduler, LambdaLR)  # `fits` admits no other schedule in skip mode
            positions = range(total_steps + 1)
            self._tables = [
                torch.tensor([base * fn(s) for s in positions], dtype=torch.float32, device=device)
                for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
            ]
        self._applied = torch.zeros((), device=device)  # skip: the device's count of applied steps
        self._started = False  # the count starts at the schedule's position on the first step (after a resume)

    # ------------------------------------------------------------------ the step (no host sync)
    def check(self, loss: torch.Tensor, grad_norm: torch.Tensor | None) -> Verdict:
        """Flag a step whose loss or gradient norm is NaN/Inf (a norm is so exactly when a gradient is)."""
        loss = loss.detach() if loss.requires_grad else loss  # the loop's loss is detached already
        self._mark(loss, [(loss + grad_norm).float()] if grad_norm is not None else [loss], self._norm_check)
        return PENDING

    def check_gradients(self, loss: torch.Tensor, grads: list[torch.Tensor]) -> Verdict:
        """Flag a step whose loss or a gradient holds a NaN/Inf, without a norm."""
        loss = loss.detach() if loss.requires_grad else loss
        self._mark(loss, [*grads, loss], self._grads_check)
        return PENDING

    def _mark(self, loss: torch.Tensor, tensors: list[torch.Tensor], check: FlagCheck) -> None:
        if not self._started:
            self._applied.fill_(float(self.scheduler.last_epoch))
            self._started = True
        flag = self._flag
        if self.mode == "skip":
            flag.zero_()
        check.mark(tensors, flag)  # sets, never resets: stop mode's stickiness for free
        if self.distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        slot = self._pending % self.window
        self._loss_slots[slot].copy_(loss)
        if self.mode == "skip":
            self._flag_slots[slot].copy_(flag)
        else:
            self._bad.add_(flag)
        self._pending += 1

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """`optimizer.step()`, skipped on the device where the flag says so, and the schedule moved:
        in stop mode by the host (every applied step precedes the first bad one), in skip mode by
        the device's count of applied steps."""
        # `found_inf` is no declared attribute of Optimizer: torch's fused step reads it where
        # GradScaler sets it (hence the ignores below)
        optimizer.found_inf = self._flag  # type: ignore[attr-defined]
        if self.mode == "stop":
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf  # type: ignore[attr-defined]
            self.scheduler.step()
            return
        index = self._applied.long().reshape(1)  # index_select: `table[index]` would read the index
        floats = [group["lr"] for group in optimizer.param_groups]
        for group, table in zip(optimizer.param_groups, self._tables, strict=True):
            group["lr"] = torch.index_select(table, 0, index).reshape(())
        try:
            optimizer.step()
        finally:
            for group, lr in zip(optimizer.param_groups, floats, strict=True):
                group["lr"] = lr
            del optimizer.found_inf  # type: ignore[attr-defined]
        self._applied.add_(1.0).sub_(self._flag)

    @property
    def full(self) -> bool:
        """Whether `settle()` must run before another step: the window of kept flags is used up."""
        return self._pending >= self.window

    # ------------------------------------------------------------------ the host's read
    def settle(self, last_step: int) -> list[BadStep]:
        """Read the pending steps' flags (one sync): the steps that were not applied, and the
        schedule's position moved to match. `last_step` is the number of the latest step taken."""
        pending, self._pending = self._pending, 0
        if not pending:
            return []
        scheduler = self.scheduler
        first = last_step - pending + 1
        with own_sync():
            if self.mode == "stop":
                bad = int(self._bad.item())
                if not bad:
                    return []
                offset = pending - bad  # every step from the first bad one on was masked
                loss = float(self._losses[offset % self.window].item())
            else:
                flags = self._flags[: min(pending, self.window)].tolist()
                losses = self._losses[: min(pending, self.window)].tolist()
        if self.mode == "stop":
            scheduler.last_epoch -= pending - offset  # the host stepped it for the masked steps too
            _set_lrs(scheduler)
            self._flag.zero_()  # the run stops at this step: nothing later should see its flag
            self._bad.zero_()
            return [BadStep(first + offset, Verdict("nonfinite", _reason(loss)))]
        skipped = [BadStep(first + i, Verdict("nonfinite", _reason(losses[i]))) for i, f in enumerate(flags) if f]
        scheduler.last_epoch += pending - len(skipped)
        _set_lrs(scheduler)
        return skipped


def _set_lrs(scheduler: LRScheduler) -> None:
    """Put the LR of the scheduler's position into its optimizer's groups, as `step()` would."""
    if isinstance(scheduler, LambdaLR):
        position = scheduler.last_epoch
        lrs = [base * fn(position) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
        for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        scheduler._last_lr = lrs  # what get_last_lr() answers


def _reason(loss: float) -> str:
    if not math.isfinite(loss):
        return f"loss is {'nan' if math.isnan(loss) else ('inf' if loss > 0 else '-inf')}"
    return "gradient norm is not finite"
