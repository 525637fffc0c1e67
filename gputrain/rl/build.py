"""Config → the parts of a PPO run, each complete when built, from the same builders the Trainer
uses: `place_run` (device, precision, ranks, process switches), `parallelize` (compile, DDP), the
optimizer and schedule builders, the Checkpointer, the MetricsLogger and the console. What is RL's
own: the environments (this rank's share), the normalisers, the policy and the rollout storage.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from gputrain.config import Config, OptimConfig
from gputrain.config.schema import RLConfig, ppo_defaults
from gputrain.config.sizes import state_memory
from gputrain.distributed.context import agree_on_path, env_world
from gputrain.distributed.parallelize import parallelize
from gputrain.env.threads import explicit_threads
from gputrain.errors import ConfigError
from gputrain.observe.console import RunConsole
from gputrain.observe.speed import SpeedMeter
from gputrain.optim import build_optimizer, build_schedule
from gputrain.precision import Precision
from gputrain.rl.envs.base import Discrete
from gputrain.rl.envs.keyed_random import ACTION, KeyedUniform
from gputrain.rl.envs.registry import ENVS
from gputrain.rl.envs.vector import TensorVecEnv
from gputrain.rl.episodes import EpisodeTracker
from gputrain.rl.normalize import ObsNormalizer, RewardNormalizer
from gputrain.rl.pipeline import TrainingEnvs
from gputrain.rl.policy import ActorCritic, build_policy
from gputrain.rl.rollout import Rollout
from gputrain.rl.run_config import ROLLOUT_NOISE_BYTES, check_fields_read, check_layout, check_rollout_fits, describe
from gputrain.run.files import default_run_dir, run_dir_path
from gputrain.run.prior import claim_run_dir, continued_config
from gputrain.train.build import Placement, place_run
from gputrain.train.checkpointer import Checkpointer, check_resume_setting
from gputrain.train.guard import build_guard
from gputrain.train.metrics import MetricsLogger
from gputrain.train.state import seed_everything
from gputrain.train.step import StepParts

CHECKPOINTS_PER_RUN = 10
"""With checkpoint.every_steps=0, a checkpoint every tenth of the iterations (and at the end)."""


@dataclass(slots=True)
class RLParts:
    """Everything the PPO loop needs, built."""

    place: Placement
    settings: RLConfig
    """The [rl] section, every `auto` resolved."""
    policy: ActorCritic
    """The module holding the parameters (state dicts, rollouts, the final weights)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    step: StepParts
    """The update as the Trainer's (apply_update): clipping (train.clip_grad_*), the non-finite
    guard (train.on_nonfinite); the schedule is the loop's, once per iteration."""
    envs: TrainingEnvs
    rollout: Rollout
    action_noise: KeyedUniform
    """The uniform numbers the policy turns into actions, keyed by (seed, step, environment)."""
    speed: SpeedMeter
    checkpointer: Checkpointer
    metrics: MetricsLogger
    console: RunConsole
    run_dir: Path
    checkpoint_every: int
    """Iterations between checkpoints."""


def placed_fields(world: int) -> dict[str, dict[str, Any]]:
    """The fields of the config `place_run` and `parallelize` see that RL decides itself, by
    section: data parallelism by DDP (none on one process), and a train.batch_size of one sample
    per rank, the smallest batch whose split over the ranks it checks: RL's batch is the rollout,
    checked against the ranks as rl.num_envs (run_config.py). The user's values of these are not read."""
    strategy: Literal["ddp", "none"] = "ddp" if world > 1 else "none"
    return {
        "train": {"batch_size": world, "grad_accum": 1, "micro_batch_size": None, "cuda_graphs": False},
        "parallel": {"strategy": strategy, "activation_checkpointing": "none"},
    }


def _placement_config(config: Config, world: int) -> Config:
    """The config `place_run` and `parallelize` see: the user's, with `placed_fields`."""
    placed = placed_fields(world).items()
    return dataclasses.replace(config, **{name: dataclasses.replace(getattr(config, name), **f) for name, f in placed})


def _env_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested == "float32" or (requested == "auto" and device.type == "mps"):
        return torch.float32
    if device.type == "mps":
        raise ConfigError("rl.env_dtype", "MPS has no float64", requested, hint="use rl.env_dtype=float32 or auto")
    return torch.float64


def resolved_config(config: Config, parts: RLParts) -> Config:
    """`config` with its [rl] section as the run reads it (every `auto` resolved, rl.env_dtype too):
    what config.toml records, so it says what ran rather than "auto"."""
    dtype = _env_dtype(config.rl.env_dtype, parts.place.device)
    env_dtype: Literal["float32", "float64"] = "float64" if dtype == torch.float64 else "float32"
    return dataclasses.replace(config, rl=dataclasses.replace(parts.settings, env_dtype=env_dtype))


def build_rl(config: Config, run_dir: str | Path | None = None) -> RLParts:
    """All the parts of a PPO run under `config` (its [rl] section, and train.device, precision,
    seed, compile, deterministic; checkpoint; log; parallel.timeout_s).

    Raises:
        UsageError (ConfigError): bad config, before anything heavy starts.
    """
    cfg = config
    s = cfg.rl.resolved()
    _, world, _ = env_world()
    check_layout(cfg, world)
    check_resume_setting(cfg.checkpoint)
    seed_everything(cfg.train.seed)  # the initial weights: the same on every rank
    dynamics = ENVS[s.env]()
    policy = build_policy(dynamics.action_space, dynamics.obs_size, tuple(s.hidden_sizes))
    placing = _placement_config(cfg, world)
    precision_choice = (
        ("fp32", "auto: autocast does not pay on RL's small networks") if cfg.train.precision == "auto" else None
    )
    place = place_run(placing, policy, None, precision_choice=precision_choice)
    device, dist = place.device, place.dist
    lines = [*place.lines]
    if device.type == "cpu" and explicit_threads(cfg.train.num_threads, os.environ) is None:
        # RL's tensors (a few environments' states, 64-wide layers) are far below the size where
        # intra-op threads pay; their hand-offs made steps 10x slower on a busy 2-core machine
        torch.set_num_threads(1)
        lines.append("rl: 1 CPU thread (RL's tensors are too small for more to pay; train.num_threads=N overrides)")
    console = RunConsole(cfg.log.progress, enabled=dist.is_main)
    for line in (*lines, describe(s, cfg.optim.lr)):
        console.info(line)
    run_path = agree_on_path(run_dir_path(run_dir) if run_dir is not None else default_run_dir("ppo", s.env), dist)
    # the last checks before anything heavy: the directory and a run it holds, the fields this run
    # leaves out (a continued run's own kept), the rollout's memory
    claim_run_dir(run_path, cfg, ppo_defaults, kind="rl")
    check_fields_read(cfg, continued_config(run_path, ppo_defaults))
    space = dynamics.action_space
    action_shape = () if isinstance(space, Discrete) else (space.size,)
    per_transition = Rollout.bytes_per_transition(dynamics.obs_size, action_shape, space.kind == "discrete")
    memory, where = state_memory(device)
    check_rollout_fits(s, dist.world_size, per_transition + ROLLOUT_NOISE_BYTES * policy.draws, memory, where)

    num_envs, num_steps = int(s.num_envs), int(s.num_steps)
    local_envs = num_envs // dist.world_size
    first_env = dist.rank * local_envs
    env = TensorVecEnv(
        dynamics,
        local_envs,
        device,
        _env_dtype(cfg.rl.env_dtype, device),
        cfg.train.seed,
        first_env,
        s.max_episode_steps,
    )
    envs = TrainingEnvs(
        env,
        EpisodeTracker(local_envs, num_envs, first_env, device, dist, block_steps=num_steps),
        ObsNormalizer(dynamics.obs_size, s.clip_obs, device, dist) if s.normalize_obs else None,
        RewardNormalizer(local_envs, s.gamma, s.clip_reward, device, dist) if s.normalize_reward else None,
        dist,
    )
    policy = policy.to(device)
    par = parallelize(policy, dist, placing, device, place.choice, place.precision)
    # CleanRL's Adam; optim.lr and optim.eps are CleanRL's too unless set (config/schema.py, ppo_defaults)
    optim = OptimConfig(name="adam", lr=cfg.optim.lr, eps=cfg.optim.eps)
    optimizer = build_optimizer(par.model.parameters(), optim, s.batch_size, device)
    # CleanRL's annealing: lr · (1 - (iteration - 1) / num_iterations), stepped once per iteration
    schedule = OptimConfig(schedule="linear" if s.anneal_lr else "constant", min_lr=0.0)
    scheduler = build_schedule(optimizer, schedule, s.num_iterations)
    precision = Precision(place.precision, device)
    step = StepParts(
        model=par.step_model,
        optimizer=optimizer,
        scheduler=scheduler,
        precision=precision,
        clip_grad_norm=cfg.train.clip_grad_norm,
        clip_grad_value=cfg.train.clip_grad_value,
        guard=build_guard(
            cfg.train.on_nonfinite, optimizer, precision, device=device, distributed=dist.enabled, window=1
        ),
        # in the optimizer's order (matrices, then vectors): the gradient norm sums them in this order
        params=[p for group in optimizer.param_groups for p in group["params"]],
    )
    rollout = Rollout.empty(num_steps, local_envs, dynamics.obs_size, action_shape, space.kind == "discrete", device)
    speed = SpeedMeter(
        policy, device, place.precision, dist.world_size, s.batch_size, None, breakdown_every=0, rank=dist.rank
    )
    every = cfg.checkpoint.every_steps or max(1, math.ceil(s.num_iterations / CHECKPOINTS_PER_RUN))
    return RLParts(
        place=place,
        settings=s,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        precision=precision,
        step=step,
        envs=envs,
        rollout=rollout,
        action_noise=KeyedUniform(cfg.train.seed, ACTION, env.env_ids, policy.draws),
        speed=speed,
        checkpointer=Checkpointer(cfg.checkpoint, run_path, dist, par.model, optimizer),
        metrics=MetricsLogger(cfg.log, run_path, dist, console, speed, optimizer, s.batch_size, s.num_iterations, None),
        console=console,
        run_dir=run_path,
        checkpoint_every=every,
    )
