"""Optimizers and learning-rate schedules."""

from gputrain.optim.optimizers import build_optimizer, effective_lr
from gputrain.optim.params import TrainParams, weight_decay_groups
from gputrain.optim.schedules import build_schedule

__all__ = ["TrainParams", "build_optimizer", "build_schedule", "effective_lr", "weight_decay_groups"]
