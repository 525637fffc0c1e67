"""Optimizers and learning-rate schedules."""

from gputrain.optim.optimizers import build_optimizer, effective_lr
from gputrain.optim.schedules import build_schedule

__all__ = ["build_optimizer", "build_schedule", "effective_lr"]
