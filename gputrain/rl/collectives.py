"""Sums over the ranks of a data-parallel RL job; on one process each is the identity."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gputrain.distributed.context import DistContext


def all_reduce_sum(value: torch.Tensor, job: DistContext) -> torch.Tensor:
    """`value` summed over every rank (a new tensor; on one process `value` itself)."""
    if not job.enabled:
        return value
    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def all_gather_cat(value: torch.Tensor, job: DistContext) -> torch.Tensor:
    """Every rank's `value` (same shape on each), concatenated along dim 0 in rank order."""
    if not job.enabled:
        return value
    parts = [torch.empty_like(value) for _ in range(job.world_size)]
    dist.all_gather(parts, value.contiguous())
    return torch.cat(parts)
