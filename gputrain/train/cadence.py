"""The loop's cadences and limits beyond its length: validation on a step cadence
(`eval.every_steps`) and a time budget (`train.max_time`).

Validation is due at a step when `eval.every_steps` divides it (counted over the whole run, so a
resume keeps the cadence), or at an epoch's end when `eval.every_epochs` divides the epoch, or at
the run's end; never twice at one step. The loop evaluates a mid-epoch validation before that
step's checkpoint, so the checkpoint holds the early-stopping state that validation left.

The time budget, as Lightning's `max_time`, counts the loop's time (steps, evaluations, saves)
summed over every invocation of the run that had a limit: the total so far rides in the
checkpoint's loop state (`LoopState.extra[ELAPSED]`, noted at every step boundary and before every
save), so a continued run carries on counting from where the saved one was. A run without a limit
records no time (its checkpoints are as they always were). It is read at step boundaries;
several ranks take rank 0's reading on logging steps (which sync anyway), so all stop at the same
step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from gputrain.config import Config
from gputrain.distributed.context import DistContext
from gputrain.errors import ConfigError
from gputrain.observe.own_sync import own_sync
from gputrain.train.state import LoopState

ELAPSED = "elapsed_s"
"""LoopState.extra's key for the loop's seconds over every invocation of the run (train.max_time)."""
TIMED_OUT = "timed_out"
"""summary.json's status of a run that train.max_time stopped (checkpoint saved; it can continue)."""


def check_cadence(config: Config, has_val: bool) -> None:
    """eval.every_steps asks for validations: a run without a validation split cannot give them
    (refused at once, rather than silently never validating).

    Raises:
        ConfigError: naming eval.every_steps.
    """
    every = config.eval.every_steps
    if every and not has_val:
        raise ConfigError(
            "eval.every_steps",
            "asks for validation every N steps, but the run has no validation split",
            every,
            hint="pass val_data= to the Trainer (or keep data.val_fraction > 0), or set eval.every_steps=0",
        )


def validation_due_mid_epoch(step: int, every_steps: int) -> bool:
    """Whether `eval.every_steps` asks for a validation after optimizer step `step`."""
    return every_steps > 0 and step % every_steps == 0


class TimeBudget:
    """train.max_time for one invocation of a run.

    Args:
        limit_s: the budget in seconds over the whole run; None: no limit, and no time recorded (as
            Lightning's Timer, which exists only with max_time: a limit first set on a continuation
            counts from there).
        clock: seconds (a test passes one it advances itself).
    """

    def __init__(self, limit_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s
        self._clock = clock
        self._began: float | None = None
        self._before = 0.0

    def start(self, state: LoopState) -> None:
        """Begin counting this invocation, after the resume filled `state` in."""
        self._began, self._before = self._clock(), float(state.extra.get(ELAPSED, 0.0))

    def note(self, state: LoopState) -> float:
        """Write the run's total so far into `state` (what a checkpoint saves), where a limit is
        set; returns it."""
        if self._began is None or self.limit_s is None:
            return float(state.extra.get(ELAPSED, 0.0))
        total = self._before + (self._clock() - self._began)
        state.extra[ELAPSED] = total
        return total

    def spent(self, state: LoopState, job: DistContext, device: torch.device, sync_point: bool) -> bool:
        """At a step boundary: whether the budget is spent, so the run stops now. One process reads
        its clock every step; several ranks take rank 0's reading on sync points only. Asked after a
        step only, so every invocation takes at least one."""
        if self.limit_s is None:
            return False
        over = self.note(state) >= self.limit_s
        if not job.enabled:
            return over
        if not sync_point:
            return False
        flag = torch.tensor([1 if over else 0], device=device)
        dist.broadcast(flag, src=0)
        with own_sync():
            return bool(flag.item())

    def reason(self, state: LoopState, saved: bool) -> str:
        """What summary.json and the console say of the stop; `saved`: a checkpoint was written
        (not with checkpoint.enabled=false, when the run cannot be continued)."""
        total = float(state.extra.get(ELAPSED, 0.0))
        kept = "with a checkpoint" if saved else "without a checkpoint (checkpoint.enabled=false)"
        return (
            f"train.max_time ({_seconds(self.limit_s or 0.0)}) spent: {_seconds(total)} in the loop over every "
            f"invocation of the run; stopped at step {state.global_step} {kept}"
        )


def _seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"
