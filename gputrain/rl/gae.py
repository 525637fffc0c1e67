"""Generalised advantage estimation (Schulman et al. 2016, eq. 11-16), as CleanRL computes it."""

from __future__ import annotations

import torch


def bootstrap_truncations(
    rewards: torch.Tensor, final_values: torch.Tensor, truncated_only: torch.Tensor, gamma: float
) -> torch.Tensor:
    """r_t + gamma · V(s_{t+1}) where the time limit cut the episode at t: the return the cut took
    away is owed to the last step, and the episode then ends there as a terminal one does."""
    return rewards + gamma * final_values * truncated_only


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each (num_steps, num_envs).

    delta_t = r_t + gamma · V(s_{t+1}) · (1 - done_t) - V(s_t)
    A_t     = delta_t + gamma · lambda · (1 - done_t) · A_{t+1}
    R_t     = A_t + V(s_t)                    (the value target)

    Args:
        dones: dones[t] is True where the episode ended at step t.
        next_value: V of the observation after the last step (bootstraps the rollout's end).
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        nextnonterminal = 1.0 - dones[t].to(rewards.dtype)
        nextvalues = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values
