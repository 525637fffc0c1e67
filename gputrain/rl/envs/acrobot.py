"""Acrobot-v1: gymnasium's `classic_control/acrobot.py` (Sutton 1996, the book's dynamics), batched.

Two links hang from a joint; torque -1, 0 or +1 at the middle joint (actions 0, 1, 2). -1 per
step; the episode terminates when the free end rises one link length above the pivot, and is
truncated at 500 steps. One step is one RK4 step of dt = 0.2 s; angles wrap to [-pi, pi] and the
angular velocities are bounded by 4·pi and 9·pi.
"""

from __future__ import annotations

from math import pi

import torch

from gputrain.rl.envs.base import Discrete, Dynamics, uniform_between

DT = 0.2
LINK_LENGTH_1 = 1.0
LINK_MASS_1 = 1.0
LINK_MASS_2 = 1.0
LINK_COM_POS_1 = 0.5
LINK_COM_POS_2 = 0.5
LINK_MOI = 1.0
MAX_VEL_1 = 4 * pi
MAX_VEL_2 = 9 * pi


def _dsdt(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Time derivatives of (theta1, theta2, dtheta1, dtheta2) under torque `a` (gymnasium's `_dsdt`,
    book_or_nips="book"), in gymnasium's order of operations."""
    m1, m2, l1 = LINK_MASS_1, LINK_MASS_2, LINK_LENGTH_1
    lc1, lc2 = LINK_COM_POS_1, LINK_COM_POS_2
    i1 = i2 = LINK_MOI
    g = 9.8
    theta1, theta2, dtheta1, dtheta2 = s.unbind(-1)
    d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * torch.cos(theta2)) + i1 + i2
    d2 = m2 * (lc2**2 + l1 * lc2 * torch.cos(theta2)) + i2
    phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - pi / 2.0)
    phi1 = (
        -m2 * l1 * lc2 * dtheta2.square() * torch.sin(theta2)
        - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * torch.sin(theta2)
        + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - pi / 2)
        + phi2
    )
    ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1.square() * torch.sin(theta2) - phi2) / (
        m2 * lc2**2 + i2 - d2.square() / d1
    )
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return torch.stack((dtheta1, dtheta2, ddtheta1, ddtheta2), dim=-1)


def _rk4(y0: torch.Tensor, a: torch.Tensor, dt: float) -> torch.Tensor:
    """One classic Runge-Kutta step of length dt (gymnasium's `rk4` over the times [0, dt]); the
    torque is constant over the step, as its zero derivative makes it there."""
    dt2 = dt / 2.0
    k1 = _dsdt(y0, a)
    k2 = _dsdt(y0 + dt2 * k1, a)
    k3 = _dsdt(y0 + dt2 * k2, a)
    k4 = _dsdt(y0 + dt * k3, a)
    return y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)


def _wrap(x: torch.Tensor) -> torch.Tensor:
    """gymnasium's `wrap(x, -pi, pi)`: whole turns subtracted or added one at a time. An RK4 step
    moves an angle by less than a turn (|velocity| <= 9·pi over 0.2 s), so two rounds suffice."""
    for _ in range(2):
        x = torch.where(x > pi, x - 2 * pi, x)
        x = torch.where(x < -pi, x + 2 * pi, x)
    return x


class Acrobot(Dynamics):
    name = "Acrobot-v1"
    state_size = 4  # theta1, theta2, dtheta1, dtheta2
    obs_size = 6  # cos theta1, sin theta1, cos theta2, sin theta2, dtheta1, dtheta2
    action_space = Discrete(3)
    max_episode_steps = 500
    reset_draws = 4

    def initial_state(self, uniform: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # gymnasium draws the start state in float64 and stores it as float32
        return uniform_between(uniform, -0.1, 0.1).to(torch.float32).to(dtype)

    def step(self, state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        torque = (action - 1).to(state.dtype)  # gymnasium's AVAIL_TORQUE[action]: -1, 0, +1
        ns = _rk4(state, torque, DT)
        theta1, theta2, dtheta1, dtheta2 = ns.unbind(-1)
        theta1, theta2 = _wrap(theta1), _wrap(theta2)
        dtheta1 = dtheta1.clamp(-MAX_VEL_1, MAX_VEL_1)
        dtheta2 = dtheta2.clamp(-MAX_VEL_2, MAX_VEL_2)
        next_state = torch.stack((theta1, theta2, dtheta1, dtheta2), dim=-1)
        terminated = -torch.cos(theta1) - torch.cos(theta2 + theta1) > 1.0
        reward = torch.where(terminated, 0.0, -1.0).to(state.dtype)
        return next_state, reward, terminated

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        theta1, theta2, dtheta1, dtheta2 = state.unbind(-1)
        return torch.stack(
            (torch.cos(theta1), torch.sin(theta1), torch.cos(theta2), torch.sin(theta2), dtheta1, dtheta2), dim=-1
        ).to(torch.float32)
