"""Learning-rate schedules over optimizer steps, with an optional linear warm-up in front."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, OneCycleLR

from gputrain.config.schema import OptimConfig


def _decay_factor(config: OptimConfig, total_steps: int, peak_lr: float) -> Callable[[int], float]:
    """LR multiplier after warm-up, as a function of the step counted from the end of warm-up."""
    span = max(1, total_steps - config.warmup_steps)
    floor = config.min_lr / peak_lr
    name = config.schedule
    if name == "constant":
        return lambda s: 1.0
    if name == "step":
        return lambda s: config.gamma ** (s // config.step_size)
    if name == "multistep":
        return lambda s: config.gamma ** sum(s >= m for m in config.milestones)
    if name == "exponential":
        return lambda s: config.gamma**s
    if name in ("cosine", "warmup_cosine"):
        return lambda s: floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(s, span) / span))
    if name == "linear":
        return lambda s: floor + (1 - floor) * max(0.0, 1 - s / span)
    raise ValueError(name)


def build_schedule(optimizer: torch.optim.Optimizer, config: OptimConfig, total_steps: int) -> LRScheduler:
    """A scheduler stepped once per optimizer step. `warmup_steps` ramps linearly from ~0 to the peak.
    Each parameter group's LR is its own peak (a user's optimizer may give its groups different LRs);
    `min_lr` is a fraction of the first group's."""
    peak_lr = optimizer.param_groups[0]["lr"]
    if config.schedule == "onecycle":
        return OneCycleLR(
            optimizer,
            max_lr=[group["lr"] for group in optimizer.param_groups],  # a user's groups keep their own LRs
            total_steps=max(1, total_steps),
            pct_start=(config.warmup_steps / total_steps) if config.warmup_steps else 0.3,
            cycle_momentum=config.name in ("sgd", "rmsprop"),
        )
    decay = _decay_factor(config, total_steps, peak_lr)
    warmup = config.warmup_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return decay(step - warmup)

    return LambdaLR(optimizer, factor)
