"""The global gradient norm whatever the parallelism: sharded (DTensor) gradients are reduced over
their mesh, and pipeline stages add their squared norms so every stage clips by the same value."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gputrain.distributed.dtensor import is_dtensor, local_tensor

__all__ = ["grad_norm_and_clip", "local_tensor"]


def _plain_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """L2 norm over local gradients. With one device and dtype (the usual case) this is one fused
    per-tensor norm and one reduction, skipping the grouping that get_total_norm does in Python
    on every call (it costs more than a small model's optimizer step on CPU)."""
    if grads and len({(g.device, g.dtype) for g in grads}) == 1:
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return torch.nn.utils.get_total_norm(grads)


def grad_norm_and_clip(
    params: list[torch.Tensor], max_norm: float | None, pp_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """L2 norm of all gradients (a device tensor, no host sync); clip to `max_norm` when given."""
    with_grad = [p for p in params if p.grad is not None]
    # sharded (DTensor) and plain gradients cannot meet in one kernel: norm each kind, then combine
    sharded = [p for p in with_grad if is_dtensor(p.grad)]
    plain = [p for p in with_grad if not is_dtensor(p.grad)]
    norms = []
    if sharded:  # FSDP/TP: each rank holds a partial norm of its shards
        partial = torch.nn.utils.get_total_norm([p.grad for p in sharded if p.grad is not None])
        norms.append(partial.full_tensor() if is_dtensor(partial) else partial)
    if plain or not sharded:
        norms.append(_plain_norm([p.grad for p in plain if p.grad is not None]))
    norm = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
    if pp_group is not None:  # each stage only sees its own layers' gradients
        squared = norm**2
        dist.all_reduce(squared, group=pp_group)
        norm = squared.sqrt()
    if max_norm is not None:
        for group in (sharded, plain):
            if group:
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
    return norm
