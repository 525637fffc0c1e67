"""The rollout: num_steps steps of every environment under the current policy, stored for the update
(CleanRL's storage tensors and its rollout loop)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gputrain.rl.envs.keyed_random import KeyedUniform
from gputrain.rl.pipeline import TrainingEnvs
from gputrain.rl.policy import ActorCritic


@dataclass(slots=True)
class Rollout:
    """One iteration's transitions of this rank, each (num_steps, num_envs, ...)."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    dones: torch.Tensor
    """dones[t]: the episode ended at step t (CleanRL's dones[t + 1]; its last entry is next_done)."""
    values: torch.Tensor
    final_obs: torch.Tensor
    """The observation each step reached before any reset (its value is owed where truncated_only)."""
    truncated_only: torch.Tensor

    @staticmethod
    def layout(
        obs_size: int, action_shape: tuple[int, ...], discrete: bool
    ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Each field's (shape of one transition, dtype)."""
        f32 = torch.float32
        return {
            "obs": ((obs_size,), f32),
            "actions": (action_shape, torch.int64 if discrete else f32),
            "logprobs": ((), f32),
            "rewards": ((), f32),
            "dones": ((), torch.bool),
            "values": ((), f32),
            "final_obs": ((obs_size,), f32),
            "truncated_only": ((), torch.bool),
        }

    @classmethod
    def bytes_per_transition(cls, obs_size: int, action_shape: tuple[int, ...], discrete: bool) -> int:
        """What one transition takes in the rollout's tensors."""
        fields = cls.layout(obs_size, action_shape, discrete).values()
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in fields)

    @classmethod
    def empty(
        cls,
        num_steps: int,
        num_envs: int,
        obs_size: int,
        action_shape: tuple[int, ...],
        discrete: bool,
        device: torch.device,
    ) -> Rollout:
        return cls(
            **{
                name: torch.zeros((num_steps, num_envs, *shape), dtype=dtype, device=device)
                for name, (shape, dtype) in cls.layout(obs_size, action_shape, discrete).items()
            }
        )


@torch.no_grad()
def collect_rollout(policy: ActorCritic, envs: TrainingEnvs, rollout: Rollout, noise: KeyedUniform) -> None:
    """Fill `rollout` with num_steps steps of every environment; `envs.obs` carries on from the
    previous rollout. No host sync: actions come from the policy and keyed noise on the device."""
    num_steps = rollout.obs.shape[0]
    uniforms = noise.steps(envs.steps_taken, num_steps)  # the whole rollout's noise in one go
    for step in range(num_steps):
        rollout.obs[step] = envs.obs
        action, logprob, value = policy.act(envs.obs, uniforms[step])
        rollout.values[step] = value
        rollout.actions[step] = action
        rollout.logprobs[step] = logprob
        result = envs.step(action)
        rollout.rewards[step] = result.reward
        rollout.dones[step] = result.done
        rollout.final_obs[step] = result.final_obs
        rollout.truncated_only[step] = result.truncated_only
