"""CartPole-v1: gymnasium's `classic_control/cartpole.py` (Barto, Sutton & Anderson 1983), batched.

A pole on a cart; push the cart left (0) or right (1) by 10 N. +1 for every step, the last one
included; the episode terminates when the cart leaves ±2.4 or the pole leans past 12°, and is
truncated at 500 steps. Euler integration with tau = 0.02 s, all in the state's dtype.
"""

from __future__ import annotations

import math

import torch

from gputrain.rl.envs.base import Discrete, Dynamics, uniform_between

GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD_RADIANS = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4


class CartPole(Dynamics):
    name = "CartPole-v1"
    state_size = 4  # x, x_dot, theta, theta_dot
    obs_size = 4
    action_space = Discrete(2)
    max_episode_steps = 500
    reset_draws = 4

    def initial_state(self, uniform: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return uniform_between(uniform, -0.05, 0.05).to(dtype)

    def step(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, x_dot, theta, theta_dot = state.unbind(-1)
        force = torch.where(action == 1, FORCE_MAG, -FORCE_MAG).to(state.dtype)
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        temp = (force + POLEMASS_LENGTH * theta_dot.square() * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * costheta.square() / TOTAL_MASS)
        )
        xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        # kinematics_integrator "euler": positions move with the old velocities
        x = x + TAU * x_dot
        x_dot = x_dot + TAU * xacc
        theta = theta + TAU * theta_dot
        theta_dot = theta_dot + TAU * thetaacc
        terminated = (
            (x < -X_THRESHOLD)
            | (x > X_THRESHOLD)
            | (theta < -THETA_THRESHOLD_RADIANS)
            | (theta > THETA_THRESHOLD_RADIANS)
        )
        reward = torch.ones_like(x)  # the terminating step earns its +1 too
        return torch.stack((x, x_dot, theta, theta_dot), dim=-1), reward, terminated

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        return state.to(torch.float32)
