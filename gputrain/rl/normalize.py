"""Observation and reward normalisation (gymnasium's NormalizeObservation and NormalizeReward, as
CleanRL's ppo_continuous_action.py wraps its environments), on the device, over all environments.

CleanRL wraps each environment separately, so each keeps its own statistics; here one set of
statistics covers every environment of every rank (as gymnasium's vector wrappers do): a rank adds
its batch's moments to the others' with a collective each step, so every rank normalises alike and
N ranks equal one process. Statistics are kept in float64.
"""

from __future__ import annotations

from typing import Any

import torch

from gputrain.distributed.context import DistContext, all_reduce_sum

EPSILON = 1e-8
"""Under the square root of the variance (gymnasium's epsilon)."""


class RunningMeanStd:
    """Mean and variance of everything seen so far, updated batch by batch (gymnasium's
    RunningMeanStd: Chan et al.'s parallel algorithm, starting from a count of 1e-4)."""

    def __init__(self, shape: tuple[int, ...], device: torch.device, job: DistContext) -> None:
        self.job = job
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)
        self.var = torch.ones(shape, dtype=torch.float64, device=device)
        self.count = torch.tensor(1e-4, dtype=torch.float64, device=device)

    def update(self, x: torch.Tensor) -> None:
        """Add a batch (first dimension) from every rank."""
        x = x.to(torch.float64)
        batch_count = x.shape[0] * self.job.world_size
        batch_mean = all_reduce_sum(x.sum(0), self.job) / batch_count
        batch_var = all_reduce_sum((x - batch_mean).square().sum(0), self.job) / batch_count
        delta = batch_mean - self.mean
        tot_count = self.count + batch_count
        new_mean = self.mean + delta * batch_count / tot_count
        m_a = self.var * self.count
        m_b = batch_var * batch_count
        m2 = m_a + m_b + delta.square() * self.count * batch_count / tot_count
        self.mean, self.var, self.count = new_mean, m2 / tot_count, tot_count

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        device = self.mean.device
        self.mean = saved["mean"].to(device, torch.float64, copy=True)
        self.var = saved["var"].to(device, torch.float64, copy=True)
        self.count = saved["count"].to(device, torch.float64, copy=True)


class ObsNormalizer:
    """(obs - mean) / sqrt(var + eps) by running statistics, clipped to ±clip (CleanRL's
    NormalizeObservation + TransformObservation(clip))."""

    def __init__(self, obs_size: int, clip: float, device: torch.device, job: DistContext) -> None:
        self.rms = RunningMeanStd((obs_size,), device, job)
        self.clip = clip

    def __call__(self, obs: torch.Tensor, update: bool = True) -> torch.Tensor:
        """Normalise a batch of observations; `update` first adds them to the statistics (gymnasium
        updates with every observation it returns, the first of each episode included)."""
        if update:
            self.rms.update(obs)
        scaled = (obs - self.rms.mean) / torch.sqrt(self.rms.var + EPSILON)
        return scaled.to(torch.float32).clamp(-self.clip, self.clip)


class RewardNormalizer:
    """reward / sqrt(var + eps), var the running variance of each environment's discounted return
    (gymnasium's NormalizeReward), clipped to ±clip (CleanRL's TransformReward)."""

    def __init__(self, num_envs: int, gamma: float, clip: float, device: torch.device, job: DistContext) -> None:
        self.rms = RunningMeanStd((), device, job)
        self.gamma = gamma
        self.clip = clip
        self.discounted = torch.zeros(num_envs, dtype=torch.float64, device=device)
        """Each environment's discounted return so far (reset by termination only, as gymnasium's)."""

    def __call__(self, reward: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
        self.discounted = self.discounted * self.gamma * (~terminated) + reward
        self.rms.update(self.discounted)
        scaled = reward / torch.sqrt(self.rms.var + EPSILON)
        return scaled.clamp(-self.clip, self.clip)
