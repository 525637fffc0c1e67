"""Pendulum-v1: gymnasium's `classic_control/pendulum.py`, batched.

Swing a pendulum up and hold it: a torque in [-2, 2]; the reward is -(theta² + 0.1·theta_dot² +
0.001·torque²) with theta normalised to [-pi, pi). Never terminates; truncated at 200 steps.
"""

from __future__ import annotations

import math

import torch

from gputrain.rl.envs.base import Box, Dynamics, uniform_between

MAX_SPEED = 8.0
MAX_TORQUE = 2.0
DT = 0.05
G = 10.0
M = 1.0
L = 1.0


def angle_normalize(x: torch.Tensor) -> torch.Tensor:
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


class Pendulum(Dynamics):
    name = "Pendulum-v1"
    state_size = 2  # theta, theta_dot
    obs_size = 3  # cos theta, sin theta, theta_dot
    action_space = Box(size=1, low=-MAX_TORQUE, high=MAX_TORQUE)
    max_episode_steps = 200
    reset_draws = 2

    def initial_state(self, uniform: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        theta = uniform_between(uniform[:, 0], -math.pi, math.pi)
        theta_dot = uniform_between(uniform[:, 1], -1.0, 1.0)
        return torch.stack((theta, theta_dot), dim=-1).to(dtype)

    def step(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        th, thdot = state.unbind(-1)
        u = action[:, 0].clamp(-MAX_TORQUE, MAX_TORQUE)
        # gymnasium keeps the terms of a float32 action in float32 (numpy's promotion of a float32
        # scalar and a Python float), and adds them to the float64 state afterwards
        torque_cost = (0.001 * u.square()).to(state.dtype)
        torque_acc = (3.0 / (M * L**2) * u).to(state.dtype)
        costs = angle_normalize(th).square() + 0.1 * thdot.square() + torque_cost
        newthdot = thdot + (3 * G / (2 * L) * torch.sin(th) + torque_acc) * DT
        newthdot = newthdot.clamp(-MAX_SPEED, MAX_SPEED)
        newth = th + newthdot * DT
        terminated = torch.zeros_like(th, dtype=torch.bool)
        return torch.stack((newth, newthdot), dim=-1), -costs, terminated

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        th, thdot = state.unbind(-1)
        return torch.stack((torch.cos(th), torch.sin(th), thdot), dim=-1).to(torch.float32)
