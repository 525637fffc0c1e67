"""Where the time of a training step goes: data wait, host→device copy, forward+backward,
optimizer, communication, other.

Only every `every`-th step is timed, so the other steps run without a single extra sync. On CUDA
the marks are device events, which measure what the device itself sees: a gap while the host
waits for data shows up as data time, work the host queued early does not. Events are read on
logging steps and at the end, when the loop syncs anyway. On CPU the work is synchronous, so
`time.perf_counter` at the same marks is exact.

Marks in one step run: start → "data" (host batch ready) → "h2d" (on the device) →
"forward_backward" → "optimizer" → "other" (the rest of the loop body). Each mark is charged with
the time since the mark before it; a category marked twice (several micro-batches) adds up.

"comm" is the data-parallel gradient communication the step waits for: DDP's all-reduce and
FSDP's reduce-scatter overlap the backward pass, and what is left of them when autograd has
computed the last gradient is waited for before `backward()` returns. `split_backward` marks that
moment on sampled steps (a callback queued at the start of the backward pass runs before the
wrappers' own end-of-backward waits), so the tail is charged to "comm". Collectives inside the
computation (FSDP's all-gathers, tensor- and pipeline-parallel traffic) stay in forward_backward;
the speed report gives comm as null where nothing is timed apart. One process: comm is 0.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import Variable

CATEGORIES = ("data", "h2d", "forward_backward", "optimizer", "comm", "other")


EARLY_STEPS = (2, 3)
"""Sampled besides every `every`-th step, so a run shorter than `every` steps still reports its
split; used only where no regular sample exists (step 1 counts FLOPs and warms up: never)."""


class StepTimer:
    """Times sampled steps. `begin(step)` before fetching step `step`'s batch (1-based),
    `mark(category)` at each boundary, `end()` after the loop body. `clock`: the host's seconds,
    used off CUDA (a test passes one it advances itself, for splits that no machine load can change)."""

    def __init__(self, device: torch.device, every: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self.device = device
        self._clock = clock
        self.every = every
        self.active = False
        self._cuda = device.type == "cuda"
        self._marks: list[tuple[str, Any]] = []
        self._pending: list[tuple[bool, list[tuple[str, Any]]]] = []
        self._early = False
        self.totals_s = dict.fromkeys(CATEGORIES, 0.0)
        self.sampled_steps = 0
        self._early_totals_s = dict.fromkeys(CATEGORIES, 0.0)
        self._early_steps = 0

    def _now(self) -> Any:
        if self._cuda:  # on the run's device, whichever device is current
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return self._clock()

    def begin(self, step: int) -> None:
        regular = self.every > 0 and step % self.every == 0
        # early samples only where a regular one would come later than they do
        self._early = self.every > EARLY_STEPS[-1] and step in EARLY_STEPS
        self.active = regular or self._early
        if self.active:
            self._marks = [("start", self._now())]

    def mark(self, category: str) -> None:
        if self.active:
            self._marks.append((category, self._now()))

    def split_backward(self, loss: torch.Tensor) -> None:
        """On a sampled step, mark "forward_backward" where autograd finishes computing gradients
        of `loss`, before any data-parallel wrapper waits for its gradient communication; the
        caller marks "comm" when backward() returns. Call just before backward()."""
        if not self.active or loss.grad_fn is None:
            return

        def queue_mark(_grad_outputs: object) -> None:
            # runs as the backward pass starts, so this callback is queued ahead of DDP's and FSDP's
            Variable._execution_engine.queue_callback(lambda: self.mark("forward_backward"))

        loss.grad_fn.register_prehook(queue_mark)

    def end(self) -> None:
        if not self.active:
            return
        self._marks.append(("other", self._now()))
        self._pending.append((self._early, self._marks))
        self._marks = []
        self.active = False

    def _elapsed(self, earlier: Any, later: Any) -> float:
        if self._cuda:
            return earlier.elapsed_time(later) / 1000.0
        return later - earlier

    def resolve(self) -> None:
        """Turn finished samples into seconds. Waits for the device only for events not yet done,
        so call it where the loop syncs anyway (logging steps, the end)."""
        for early, marks in self._pending:
            if self._cuda:
                marks[-1][1].synchronize()
            totals = self._early_totals_s if early else self.totals_s
            for (_, earlier), (category, later) in itertools.pairwise(marks):
                totals[category] += self._elapsed(earlier, later)
            if early:
                self._early_steps += 1
            else:
                self.sampled_steps += 1
        self._pending.clear()

    def mean_seconds(self) -> dict[str, float] | None:
        """Mean seconds per sampled step for each category (from the early samples where the run
        had no regular one), or None before any sample."""
        self.resolve()
        if self.sampled_steps:
            return {c: s / self.sampled_steps for c, s in self.totals_s.items()}
        if self._early_steps:
            return {c: s / self._early_steps for c, s in self._early_totals_s.items()}
        return None

    @property
    def steps_behind_mean(self) -> int:
        """How many steps the mean is of: the regular samples, else the early ones."""
        self.resolve()
        return self.sampled_steps or self._early_steps

    def fractions(self) -> dict[str, float] | None:
        """Share of a sampled step's time in each category (they sum to 1)."""
        mean = self.mean_seconds()
        if mean is None:
            return None
        total = sum(mean.values())
        return {c: (s / total if total > 0 else 0.0) for c, s in mean.items()}
