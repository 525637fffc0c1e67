"""MountainCar-v0: gymnasium's `classic_control/mountain_car.py` (Moore 1990), batched.

An underpowered car in a valley; accelerate left (0), not at all (1) or right (2). -1 per step;
the episode terminates on reaching position 0.5 and is truncated at 200 steps.
"""

from __future__ import annotations

import torch

from gputrain.rl.envs.base import Discrete, Dynamics, uniform_between

MIN_POSITION = -1.2
MAX_POSITION = 0.6
MAX_SPEED = 0.07
GOAL_POSITION = 0.5
GOAL_VELOCITY = 0.0
FORCE = 0.001
GRAVITY = 0.0025


class MountainCar(Dynamics):
    name = "MountainCar-v0"
    state_size = 2  # position, velocity
    obs_size = 2
    action_space = Discrete(3)
    max_episode_steps = 200
    reset_draws = 1

    def initial_state(self, uniform: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        position = uniform_between(uniform[:, 0], -0.6, -0.4).to(dtype)
        return torch.stack((position, torch.zeros_like(position)), dim=-1)

    def step(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        position, velocity = state.unbind(-1)
        push = (action - 1).to(state.dtype) * FORCE
        velocity = velocity + (push + torch.cos(3 * position) * (-GRAVITY))
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED)
        position = (position + velocity).clamp(MIN_POSITION, MAX_POSITION)
        # the left wall stops the car
        velocity = torch.where((position == MIN_POSITION) & (velocity < 0), 0.0, velocity)
        terminated = (position >= GOAL_POSITION) & (velocity >= GOAL_VELOCITY)
        reward = torch.full_like(position, -1.0)
        return torch.stack((position, velocity), dim=-1), reward, terminated

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        return state.to(torch.float32)
