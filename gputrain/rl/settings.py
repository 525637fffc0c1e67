"""The [rl] section with every `auto` resolved: the PPO hyperparameters of one run, typed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gputrain.config.names import ENV_ACTIONS
from gputrain.config.schema import Config, RLConfig
from gputrain.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PPOSettings:
    """CleanRL's `Args` of ppo.py / ppo_continuous_action.py, as this run uses them (names kept)."""

    env: str
    policy: Literal["categorical", "gaussian"]
    hidden_sizes: tuple[int, ...]
    total_timesteps: int
    num_envs: int
    """Over all ranks."""
    num_steps: int
    learning_rate: float
    anneal_lr: bool
    adam_eps: float
    gamma: float
    gae_lambda: float
    num_minibatches: int
    update_epochs: int
    norm_adv: bool
    clip_coef: float
    clip_vloss: bool
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    target_kl: float | None
    normalize_obs: bool
    normalize_reward: bool
    clip_obs: float
    clip_reward: float
    bootstrap_truncated: bool
    max_episode_steps: int | None
    stop_at_return: float | None

    @classmethod
    def from_config(cls, rl: RLConfig) -> PPOSettings:
        discrete = ENV_ACTIONS[rl.env] == "discrete"
        return cls(
            env=rl.env,
            policy="categorical" if discrete else "gaussian",
            hidden_sizes=tuple(rl.hidden_sizes),
            total_timesteps=int(rl.value("total_timesteps")),
            num_envs=int(rl.value("num_envs")),
            num_steps=int(rl.value("num_steps")),
            learning_rate=float(rl.value("learning_rate")),
            anneal_lr=rl.anneal_lr,
            adam_eps=rl.adam_eps,
            gamma=rl.gamma,
            gae_lambda=rl.gae_lambda,
            num_minibatches=int(rl.value("num_minibatches")),
            update_epochs=int(rl.value("update_epochs")),
            norm_adv=rl.norm_adv,
            clip_coef=rl.clip_coef,
            clip_vloss=rl.clip_vloss,
            ent_coef=float(rl.value("ent_coef")),
            vf_coef=rl.vf_coef,
            max_grad_norm=rl.max_grad_norm,
            target_kl=rl.target_kl,
            normalize_obs=bool(rl.value("normalize_obs")),
            normalize_reward=bool(rl.value("normalize_reward")),
            clip_obs=rl.clip_obs,
            clip_reward=rl.clip_reward,
            bootstrap_truncated=rl.bootstrap_truncated,
            max_episode_steps=rl.max_episode_steps,
            stop_at_return=rl.stop_at_return,
        )

    @property
    def batch_size(self) -> int:
        """Transitions per rollout over all ranks (CleanRL's batch_size)."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        return self.total_timesteps // self.batch_size

    def describe(self) -> str:
        """The console's line about the algorithm."""
        return (
            f"rl: PPO ({self.policy} policy, hidden {list(self.hidden_sizes)}) on {self.env}: "
            f"{self.num_envs} envs × {self.num_steps} steps = {self.batch_size} transitions per iteration, "
            f"{self.num_iterations} iterations ({self.num_iterations * self.batch_size:,} env steps), "
            f"{self.update_epochs} epochs × {self.num_minibatches} minibatches of {self.minibatch_size}, "
            f"lr {self.learning_rate:g}{' annealed' if self.anneal_lr else ''}"
        )


def check_layout(config: Config, world: int) -> None:
    """The job's shape fits RL's data parallelism (each rank its own environments): checked in the
    launching command too, so a bad --nproc-per-node is one line before any rank starts."""
    strategy = config.parallel.strategy
    if strategy not in ("auto", "none", "ddp"):
        raise ConfigError(
            "parallel.strategy",
            "gputrain rl trains data-parallel (each rank its own environments): use auto, ddp or none",
            strategy,
        )
    num_envs = int(config.rl.value("num_envs"))
    if num_envs % world:
        raise ConfigError(
            "rl.num_envs",
            f"must divide evenly over the {world} ranks (each steps num_envs / ranks environments)",
            num_envs,
            hint=f"use a multiple of {world}",
        )
