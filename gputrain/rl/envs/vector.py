"""N environments as one batch of tensors on the device: time limits and auto-reset included.

A step is a few tensor operations for all environments at once; there is no Python loop over
environments and no host-device sync. Auto-reset happens in the same step (as in PureJaxRL and
Isaac Gym, and unlike gymnasium's vector default, which resets on the next call): where an episode
ended, the observation returned is the first one of the next episode, and `final_obs` holds the last
one of the ended episode, which a learner needs to bootstrap a truncated episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gputrain.rl.envs.base import Dynamics
from gputrain.rl.envs.keyed_random import RESET, KeyedUniform


@dataclass(frozen=True, slots=True)
class Transition:
    """What one step of all environments returns."""

    obs: torch.Tensor
    """(N, obs_size) float32: the next observation; after an episode's end, the new episode's first."""
    reward: torch.Tensor
    """(N,) in the state's dtype."""
    terminated: torch.Tensor
    """(N,) bool: the episode reached a terminal state (no value beyond it)."""
    truncated: torch.Tensor
    """(N,) bool: the time limit cut the episode (its last state still has a value)."""
    final_obs: torch.Tensor
    """(N, obs_size) float32: the observation the step reached, before any reset."""


class TensorVecEnv:
    """Args:
    dynamics: the environment's physics.
    num_envs: environments this process steps.
    device: where their state lives.
    dtype: of the state: float64 follows gymnasium's arithmetic exactly; float32 is faster on GPUs
        with little float64 throughput.
    seed: keys every random start state (keyed_random.py).
    first_env: the global index of this process's first environment (rank × num_envs under
        data parallelism), so each environment draws the same start states wherever it runs.
    max_episode_steps: the time limit (None: gymnasium's for this environment).
    """

    def __init__(
        self,
        dynamics: Dynamics,
        num_envs: int,
        device: torch.device,
        dtype: torch.dtype = torch.float64,
        seed: int = 0,
        first_env: int = 0,
        max_episode_steps: int | None = None,
    ) -> None:
        self.dynamics = dynamics
        self.num_envs = num_envs
        self.device = device
        self.dtype = dtype
        self.seed = seed
        self.max_episode_steps = max_episode_steps or dynamics.max_episode_steps
        self.first_env = first_env
        self.env_ids = torch.arange(first_env, first_env + num_envs, device=device, dtype=torch.int64)
        self.steps_taken = 0
        """Steps of the whole batch so far: the key of the next step's randomness."""
        self._reset_numbers = KeyedUniform(seed, RESET, self.env_ids, dynamics.reset_draws)
        self.state = self._start_states(0)
        self.elapsed = torch.zeros(num_envs, dtype=torch.int64, device=device)
        """Steps into the current episode, per environment."""

    @property
    def action_space(self) -> Any:
        return self.dynamics.action_space

    def _start_states(self, key_step: int) -> torch.Tensor:
        return self.dynamics.initial_state(self._reset_numbers.at(key_step), self.dtype)

    def observe(self) -> torch.Tensor:
        """The current observation of every environment (float32)."""
        return self.dynamics.observe(self.state)

    def step(self, action: torch.Tensor) -> Transition:
        """Step every environment with its action; reset those whose episode ended."""
        state, reward, terminated = self.dynamics.step(self.state, action)
        self.steps_taken += 1
        elapsed = self.elapsed + 1
        truncated = elapsed >= self.max_episode_steps  # gymnasium's TimeLimit: also on a terminal step
        done = terminated | truncated
        final_obs = self.dynamics.observe(state)
        # every environment draws a start state and the ended ones take it: no branch, no sync
        fresh = self._start_states(self.steps_taken)
        self.state = torch.where(done.unsqueeze(-1), fresh, state)
        self.elapsed = torch.where(done, 0, elapsed)
        obs = torch.where(done.unsqueeze(-1), self.dynamics.observe(fresh), final_obs)
        return Transition(obs, reward, terminated, truncated, final_obs)

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state, "elapsed": self.elapsed, "steps_taken": self.steps_taken}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.state = saved["state"].to(self.device, self.dtype, copy=True)
        self.elapsed = saved["elapsed"].to(self.device, torch.int64, copy=True)
        self.steps_taken = int(saved["steps_taken"])
