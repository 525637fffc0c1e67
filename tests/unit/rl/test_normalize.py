"""Observation and reward normalisation equal gymnasium's wrappers' statistics (in float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gputrain.distributed.context import DistContext
from gputrain.rl.normalize import ObsNormalizer, RewardNormalizer, RunningMeanStd

gym = pytest.importorskip("gymnasium")
from gymnasium.wrappers.utils import RunningMeanStd as GymRunningMeanStd  # noqa: E402


def test_running_mean_std_equals_gymnasiums():
    rng = np.random.default_rng(0)
    ours, theirs = RunningMeanStd((3,), torch.device("cpu"), DistContext()), GymRunningMeanStd(shape=(3,))
    for _ in range(50):
        batch = rng.normal(5.0, 2.0, (int(rng.integers(1, 40)), 3))
        ours.update(torch.from_numpy(batch))
        theirs.update(batch)
    np.testing.assert_allclose(ours.mean.numpy(), theirs.mean, rtol=1e-12)
    np.testing.assert_allclose(ours.var.numpy(), theirs.var, rtol=1e-10)
    assert ours.count.item() == pytest.approx(theirs.count)


def test_observations_are_centred_scaled_and_clipped():
    normalizer = ObsNormalizer(2, clip=10.0, device=torch.device("cpu"), job=DistContext())
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        out = normalizer(torch.randn(64, 2, generator=g) * torch.tensor([3.0, 0.1]) + torch.tensor([100.0, -1.0]))
    assert out.dtype == torch.float32
    assert out.mean(0).abs().max() < 0.3 and (out.std(0) - 1).abs().max() < 0.2
    assert normalizer(torch.tensor([[1e9, 0.0]]))[0, 0] == 10.0


def test_reward_scaling_equals_gymnasiums_normalize_reward_on_one_environment():
    env = gym.wrappers.NormalizeReward(gym.make("Pendulum-v1"), gamma=0.99)
    env.reset(seed=0)
    ours = RewardNormalizer(1, gamma=0.99, clip=1e9, device=torch.device("cpu"), job=DistContext())
    raw_env = env.env
    for step in range(300):
        action = np.array([np.sin(step / 10)], dtype=np.float32)
        state_before = np.asarray(raw_env.unwrapped.state).copy()
        _, scaled, terminated, truncated, _ = env.step(action)
        raw_env_reward = _pendulum_reward(state_before, action)
        mine = ours(torch.tensor([raw_env_reward], dtype=torch.float64), torch.tensor([terminated]))
        assert mine.item() == pytest.approx(float(scaled), rel=1e-9)
        if terminated or truncated:
            env.reset()


def _pendulum_reward(state: np.ndarray, action: np.ndarray) -> float:
    th, thdot = state
    u = np.clip(action, -2.0, 2.0)[0]
    return -(((th + np.pi) % (2 * np.pi) - np.pi) ** 2 + 0.1 * thdot**2 + 0.001 * u**2)
