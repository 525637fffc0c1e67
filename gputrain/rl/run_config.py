"""The [rl] section as a PPO run reads it (`RLConfig.resolved()`, every `auto` resolved; optim.lr,
optim.eps and train.clip_grad_norm default to CleanRL's for `gputrain rl`, `ppo_defaults`): the
console's line about it, and the check of the job's shape. No torch here: the launching command
checks the layout before any rank starts."""

from __future__ import annotations

from gputrain.config.schema import Config, RLConfig
from gputrain.errors import ConfigError


def describe(rl: RLConfig, lr: float) -> str:
    """The console's line about the algorithm (`rl` resolved; `lr`: optim.lr)."""
    return (
        f"rl: PPO ({rl.policy} policy, hidden {list(rl.hidden_sizes)}) on {rl.env}: "
        f"{rl.num_envs} envs × {rl.num_steps} steps = {rl.batch_size} transitions per iteration, "
        f"{rl.num_iterations} iterations ({rl.num_iterations * rl.batch_size:,} env steps), "
        f"{rl.update_epochs} epochs × {rl.num_minibatches} minibatches of {rl.minibatch_size}, "
        f"lr {lr:g}{' annealed' if rl.anneal_lr else ''}"
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
