"""What a PPO checkpoint holds beyond the Trainer's (weights, optimizer, schedule, loop counters,
RNGs): the environments' state, and the check that a checkpoint's environments are this run's
before anything of it is applied."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gputrain.checkpoint.matching import CheckpointMismatch, dtype_text, kind_of_value, listing, shape_text
from gputrain.rl.pipeline import TrainingEnvs

ENV_KEY = "rl"
"""The entry of state.pt that holds the environments (TrainingEnvs.state_dict)."""


def check_env_state(path: Path, saved: Mapping[str, Any], envs: TrainingEnvs, total_envs: int) -> None:
    """Raise CheckpointMismatch unless `saved` (a state.pt) holds environments of this run's kind,
    number and dtype, with the normalisers this run uses. Changes nothing."""
    env_state = saved.get(ENV_KEY)
    if not isinstance(env_state, Mapping) or not isinstance(env_state.get("per_env"), Mapping):
        raise CheckpointMismatch(path, "state.pt holds no environment state: it is not a checkpoint of `gputrain rl`")
    per_env = env_state["per_env"]
    expected = envs.expected_shapes(total_envs)
    lacking = [k for k in expected if k not in per_env]
    if lacking:
        raise CheckpointMismatch(
            path, f"state.pt: the environment state lacks {listing(lacking)} (another rl.normalize_reward?)"
        )
    for name, (shape, dtype) in expected.items():
        value = per_env[name]
        if not isinstance(value, torch.Tensor):
            raise CheckpointMismatch(
                path, f"state.pt: the environments' {name} is {kind_of_value(value)}, not a tensor"
            )
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise CheckpointMismatch(
                path,
                f"state.pt: the environments' {name} is {shape_text(value.shape)} {dtype_text(value.dtype)}, "
                f"this run's {shape_text(shape)} {dtype_text(dtype)} (another rl.env, rl.num_envs or rl.env_dtype?)",
            )
    for key, field, used in (
        ("obs_rms", "rl.normalize_obs", envs.obs_normalizer),
        ("return_rms", "rl.normalize_reward", envs.reward_normalizer),
    ):
        if used is not None and not isinstance(env_state.get(key), Mapping):
            raise CheckpointMismatch(path, f"state.pt holds no {key} statistics: it was saved without {field}")
    steps = env_state.get("steps_taken")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise CheckpointMismatch(path, f"state.pt: the environments' step counter is {steps!r}, not a count")
