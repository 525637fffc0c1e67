"""The tensor environments by gymnasium id."""

from __future__ import annotations

import torch

from gputrain.rl.envs.acrobot import Acrobot
from gputrain.rl.envs.base import Dynamics
from gputrain.rl.envs.cartpole import CartPole
from gputrain.rl.envs.mountain_car import MountainCar
from gputrain.rl.envs.pendulum import Pendulum
from gputrain.rl.envs.vector import TensorVecEnv

ENVS: dict[str, type[Dynamics]] = {cls.name: cls for cls in (Acrobot, CartPole, MountainCar, Pendulum)}
"""gymnasium id -> dynamics. gputrain.config.names.ENV_ACTIONS lists the same ids (checked by a test)."""


def make_env(
    name: str,
    num_envs: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    first_env: int = 0,
    max_episode_steps: int | None = None,
) -> TensorVecEnv:
    """`num_envs` environments `name` (e.g. "CartPole-v1") as tensors on `device`.

    Raises:
        KeyError: an unknown name (the config names it before this runs, with a did-you-mean).
    """
    return TensorVecEnv(ENVS[name](), num_envs, torch.device(device), dtype, seed, first_env, max_episode_steps)
