"""The global gradient norm whatever the parallelism: sharded (DTensor) gradients are reduced over
their mesh, and pipeline stages add their squared norms so every stage clips by the same value."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def grad_norm_and_clip(params: list[torch.Tensor], max_norm: float | None,
                       pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """L2 norm of all gradients (a device tensor, no host sync); clip to `max_norm` when given."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):  # FSDP/TP: each rank holds a partial norm of its shards
        norm = norm.full_tensor()
    if pp_group is not None:  # each stage only sees its own layers' gradients
        squared = norm ** 2
        dist.all_reduce(squared, group=pp_group)
        norm = squared.sqrt()
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
