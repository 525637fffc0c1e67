"""What an environment is here: its physics as pure functions of a batch of states.

A `Dynamics` knows nothing of time limits, resets or how many environments run: it maps a batch of
states (one row per environment) and a batch of actions to the next states, rewards and
terminations, with tensor operations only. `TensorVecEnv` (vector.py) adds the rest. Each
environment module transcribes gymnasium's `step` line for line, in the same order of operations,
so the trajectories agree with gymnasium's to the last bits where the math library allows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from gputrain.config.names import ActionKind


@dataclass(frozen=True, slots=True)
class Discrete:
    """Actions 0..n-1 (gymnasium's `spaces.Discrete(n)`)."""

    n: int
    kind: ClassVar[ActionKind] = "discrete"

    def describe(self) -> str:
        return f"{self.n} discrete actions"


@dataclass(frozen=True, slots=True)
class Box:
    """Real-valued actions of `size` components, each in [low, high] (gymnasium's `spaces.Box`)."""

    size: int
    low: float
    high: float
    kind: ClassVar[ActionKind] = "continuous"

    def describe(self) -> str:
        return f"continuous actions: {self.size} in [{self.low:g}, {self.high:g}]"


ActionSpace = Discrete | Box


class Dynamics(ABC):
    """One kind of environment's physics, batched over the first dimension."""

    name: ClassVar[str]
    """gymnasium's id, e.g. CartPole-v1."""
    state_size: ClassVar[int]
    obs_size: ClassVar[int]
    action_space: ClassVar[ActionSpace]
    max_episode_steps: ClassVar[int]
    """gymnasium's TimeLimit for this id."""
    reset_draws: ClassVar[int]
    """Uniform numbers one reset takes."""

    @abstractmethod
    def initial_state(self, uniform: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Start states from uniform numbers in (0, 1), shape (N, reset_draws): gymnasium's `reset`."""

    @abstractmethod
    def step(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(next state, reward, terminated) for each row: gymnasium's `step` before its TimeLimit."""

    @abstractmethod
    def observe(self, state: torch.Tensor) -> torch.Tensor:
        """The float32 observation of each state, as gymnasium returns it."""


def uniform_between(uniform: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """numpy's `Generator.uniform(low, high)` applied to a draw in (0, 1): low + (high - low) * u."""
    return low + (high - low) * uniform
