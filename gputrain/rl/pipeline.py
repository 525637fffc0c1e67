"""The environments as the learner sees them: the tensor environments, then the episode counter (on
raw rewards), then observation and reward normalisation, in the order CleanRL wraps them.

`state_dict` is what a checkpoint needs to continue bit for bit: every environment's physics, clock
and episode so far, the normalisers' statistics, the observation the policy sees next. Per-environment
tensors are gathered from all ranks in global environment order, so a checkpoint holds every
environment once and each rank takes its own slice back (on any number of ranks that divides them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gputrain.distributed.context import DistContext, all_gather_cat
from gputrain.rl.envs.vector import TensorVecEnv
from gputrain.rl.episodes import EpisodeTracker
from gputrain.rl.normalize import ObsNormalizer, RewardNormalizer


@dataclass(frozen=True, slots=True)
class EnvStep:
    """One step of every environment, as the learner uses it."""

    obs: torch.Tensor
    """(N, obs) float32, normalised: the next input of the policy."""
    reward: torch.Tensor
    """(N,) float32, normalised."""
    done: torch.Tensor
    """(N,) bool: the episode ended (terminated or truncated)."""
    truncated_only: torch.Tensor
    """(N,) bool: the time limit cut a non-terminal state, whose value is still owed."""
    final_obs: torch.Tensor
    """(N, obs) float32, normalised: the state the step reached, before any reset."""


class TrainingEnvs:
    """Args:
    env: this rank's environments.
    tracker: counts episodes on the raw rewards.
    obs_normalizer, reward_normalizer: None where off.
    job: the ranks (checkpoints gather every rank's environments).
    """

    def __init__(
        self,
        env: TensorVecEnv,
        tracker: EpisodeTracker,
        obs_normalizer: ObsNormalizer | None,
        reward_normalizer: RewardNormalizer | None,
        job: DistContext,
    ) -> None:
        self.env = env
        self.tracker = tracker
        self.obs_normalizer = obs_normalizer
        self.reward_normalizer = reward_normalizer
        self.job = job
        first = env.observe()
        self.obs = obs_normalizer(first) if obs_normalizer is not None else first
        """The observation the policy acts on next."""

    @property
    def steps_taken(self) -> int:
        return self.env.steps_taken

    def step(self, action: torch.Tensor) -> EnvStep:
        raw = self.env.step(action)
        done = raw.terminated | raw.truncated
        self.tracker.record(raw.reward, done, self.env.steps_taken)
        obs, final_obs, reward = raw.obs, raw.final_obs, raw.reward
        if self.obs_normalizer is not None:
            obs = self.obs_normalizer(obs)
            final_obs = self.obs_normalizer(final_obs, update=False)
        if self.reward_normalizer is not None:
            reward = self.reward_normalizer(reward, raw.terminated)
        self.obs = obs
        return EnvStep(obs, reward.to(torch.float32), done, raw.truncated & ~raw.terminated, final_obs)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """Collective when several ranks run."""
        episodes = self.tracker.state_dict()
        window = episodes.pop("window")
        per_env = {
            "physics": self.env.state,
            "elapsed": self.env.elapsed,
            "obs": self.obs,
            **{f"episode.{k}": v for k, v in episodes.items()},
        }
        if self.reward_normalizer is not None:
            per_env["discounted_return"] = self.reward_normalizer.discounted
        state: dict[str, Any] = {
            "per_env": {k: all_gather_cat(v, self.job).cpu() for k, v in per_env.items()},
            "steps_taken": self.env.steps_taken,
            "episode_window": {k: v.cpu() for k, v in window.items()},
        }
        if self.obs_normalizer is not None:
            state["obs_rms"] = {k: v.cpu() for k, v in self.obs_normalizer.rms.state_dict().items()}
        if self.reward_normalizer is not None:
            state["return_rms"] = {k: v.cpu() for k, v in self.reward_normalizer.rms.state_dict().items()}
        return state

    def expected_shapes(self, total_envs: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The per-environment tensors a checkpoint of this run holds: name -> (shape, dtype)."""
        shapes = {
            "physics": ((total_envs, self.env.dynamics.state_size), self.env.dtype),
            "elapsed": ((total_envs,), torch.int64),
            "obs": ((total_envs, self.env.dynamics.obs_size), torch.float32),
        }
        for name in EpisodeTracker.PER_ENV:
            shapes[f"episode.{name}"] = ((total_envs,), getattr(self.tracker, name).dtype)
        if self.reward_normalizer is not None:
            shapes["discounted_return"] = ((total_envs,), torch.float64)
        return shapes

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """This rank's slice of every environment's state, and the shared statistics."""
        device = self.env.device
        first, n = self.env.first_env, self.env.num_envs
        mine = {k: v[first : first + n].to(device, copy=True) for k, v in saved["per_env"].items()}
        self.env.load_state_dict(
            {"state": mine["physics"], "elapsed": mine["elapsed"], "steps_taken": saved["steps_taken"]}
        )
        self.obs = mine["obs"]
        episodes = {k.removeprefix("episode."): v for k, v in mine.items() if k.startswith("episode.")}
        self.tracker.load_state_dict({**episodes, "window": saved["episode_window"]})
        if self.obs_normalizer is not None:
            self.obs_normalizer.rms.load_state_dict(saved["obs_rms"])
        if self.reward_normalizer is not None:
            self.reward_normalizer.rms.load_state_dict(saved["return_rms"])
            self.reward_normalizer.discounted = mine["discounted_return"]
