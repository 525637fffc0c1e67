"""Classic-control environments stepped as batches of tensors: CartPole, Acrobot, MountainCar,
Pendulum, with gymnasium's dynamics."""

from gputrain.rl.envs.base import Box, Discrete, Dynamics
from gputrain.rl.envs.registry import ENVS, make_env
from gputrain.rl.envs.vector import TensorVecEnv, Transition

__all__ = ["ENVS", "Box", "Discrete", "Dynamics", "TensorVecEnv", "Transition", "make_env"]
