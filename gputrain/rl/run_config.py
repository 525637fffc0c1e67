"""The [rl] section as a PPO run reads it (`RLConfig.resolved()`, every `auto` resolved; optim.lr,
optim.eps and train.clip_grad_norm default to CleanRL's for `gputrain rl`, `ppo_defaults`): the
console's line about it, the fields of the other sections a PPO run reads (`READS`; one it does not
read, set, is refused rather than silently left out), the check of the job's shape and of the
rollout's memory. No torch here: the launching command checks the config before any rank starts."""

from __future__ import annotations

from typing import Any

from gputrain.config.schema import SECTIONS, Config, RLConfig
from gputrain.config.sizes import SKIP_MEMORY_CHECK_ENV, in_unit_of, memory_check_skipped
from gputrain.errors import ConfigError

READS = (
    "rl.",
    # place_run (device, precision, switches, threads, the process group), the update's clipping and
    # guard, compile
    "train.device",
    "train.precision",
    "train.seed",
    "train.deterministic",
    "train.num_threads",
    "train.compile",
    "train.clip_grad_norm",
    "train.clip_grad_value",
    "train.on_nonfinite",
    "optim.lr",  # CleanRL's Adam, annealed by rl.anneal_lr
    "optim.eps",
    "checkpoint.enabled",
    "checkpoint.every_steps",
    "checkpoint.keep_last",
    "checkpoint.keep_best",
    "checkpoint.async_save",
    "checkpoint.resume",
    "log.every_steps",
    "log.progress",
    "log.tensorboard",
    "log.mlflow",
    "log.wandb",
    "parallel.strategy",  # data parallelism only (check_layout)
    "parallel.timeout_s",
    "parallel.cpu_offload",
)
"""The fields a PPO run reads (a key ending in "." names a whole section); every other field of the
config it leaves out, its value unused: the model is the policy (rl.hidden_sizes), the data the environments,
the batch the rollout, the optimizer Adam, the schedule rl.anneal_lr, checkpoints every
checkpoint.every_steps iterations (no epochs, no periodic put-off), no evaluation and no step
breakdown. tests/unit/rl/test_run_config.py records what a run reads and holds this to it."""

ALSO_ACCEPTED: dict[str, tuple[Any, ...]] = {"optim.name": ("adam",)}
"""Values of an unread field that say what a PPO run does anyway (it trains with Adam)."""

INSTEAD: dict[str, str] = {
    "model.hidden_sizes": "rl.hidden_sizes",
    "train.epochs": "rl.total_timesteps",
    "train.max_steps": "rl.total_timesteps",
    "train.batch_size": "rl.num_envs and rl.num_steps",
    "optim.schedule": "rl.anneal_lr",
    "checkpoint.every_epochs": "checkpoint.every_steps (iterations)",
}
"""The field of a PPO run that does what an unread field does in `gputrain train`, for the message."""

ROLLOUT_NOISE_BYTES = 8
"""Bytes of keyed noise per transition and draw: the rollout's uniforms are drawn in float64."""


def reads(key: str) -> bool:
    """Whether a PPO run reads the field `key` (section.name)."""
    return any(key == read or (read.endswith(".") and key.startswith(read)) for read in READS)


def check_fields_read(config: Config, saved: Config | None = None) -> None:
    """Every field a PPO run does not read is at its default (or says what the run does anyway,
    ALSO_ACCEPTED), but where it has the value of the run being continued (`saved`: the config.toml
    of a run written before this check, kept as that run had it).

    Raises:
        ConfigError: naming the first field set that a PPO run does not use.
    """
    default = Config()
    for section in SECTIONS:
        given, base = getattr(config, section), getattr(default, section)
        kept = getattr(saved, section) if saved is not None else None
        for name in base.__dataclass_fields__:
            key, value = f"{section}.{name}", getattr(given, name)
            if reads(key) or value == getattr(base, name) or value in ALSO_ACCEPTED.get(key, ()):
                continue
            if kept is not None and value == getattr(kept, name):
                continue
            instead = f" (what sets this in rl: {INSTEAD[key]})" if key in INSTEAD else ""
            raise ConfigError(key, f"gputrain rl does not use this field{instead}; leave it unset", value)


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


def check_rollout_fits(
    rl: RLConfig, ranks: int, per_transition: int, memory: tuple[int, str] | None, where: str
) -> None:
    """The rollout (rl.num_envs / ranks environments × rl.num_steps steps, `per_transition` bytes
    each: the rollout's tensors and its noise) fits in the memory of the device that holds it
    (`memory`: bytes and what bounds them; `where`: the device), before any of it is allocated.

    Raises:
        ConfigError: naming rl.num_envs and rl.num_steps, the bytes asked and the bytes there are.
    """
    if memory is None or memory_check_skipped():
        return
    num_envs, num_steps = int(rl.value("num_envs")), int(rl.value("num_steps"))
    transitions = num_envs // max(1, ranks) * num_steps
    asked = transitions * per_transition
    if asked <= memory[0]:
        return
    share = f" ({num_envs // ranks} environments per rank)" if ranks > 1 else ""
    size = in_unit_of(asked, memory[0])
    raise ConfigError(
        "rl.num_envs",
        f"with rl.num_steps = {num_steps}{share}, a rollout holds {transitions:,} transitions: {size(asked)} or "
        f"more, but {where} has {size(memory[0])} ({memory[1]})",
        num_envs,
        hint=f"use smaller rl.num_envs or rl.num_steps (or set {SKIP_MEMORY_CHECK_ENV}=1 to try anyway)",
    )
