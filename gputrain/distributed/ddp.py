"""Data parallelism by replication: DistributedDataParallel over the dp_replicate mesh dimension."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel


def apply_ddp(model: nn.Module, mesh: DeviceMesh, device: torch.device) -> nn.Module:
    """Wrap in DDP over `mesh` (1-D). Gradients are averaged in buckets overlapping the backward pass.

    Returns the wrapper; the caller keeps `model` for its state dict (DDP adds a `module.` prefix).
    """
    device_ids = (
        [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
    )
    # DDP broadcasts buffers (BatchNorm statistics) from rank 0 each forward only when a model has any
    return DistributedDataParallel(model, device_ids=device_ids, process_group=mesh.get_group())
