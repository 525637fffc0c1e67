"""Apply parallelism to a model in one fixed place. Model code knows nothing of it."""

from __future__ import annotations

import torch
from torch import nn

from gputrain.config.schema import Config
from gputrain.distributed.context import DistContext


def parallelize(model: nn.Module, ctx: DistContext, config: Config, device: torch.device) -> nn.Module:
    """Wrap for the job's world size: unchanged on one process, DDP across several ranks.

    Returns the module the training step calls (the caller keeps the unwrapped one for state dicts).
    """
    if config.train.compile or (config.train.cuda_graphs and device.type == "cuda"):
        # reduce-overhead: compile, then capture the step in CUDA graphs (launch cost ~ 0)
        mode = "reduce-overhead" if config.train.cuda_graphs and device.type == "cuda" else None
        model = torch.compile(model, mode=mode)  # type: ignore[assignment]
    if not ctx.enabled or config.parallel.strategy == "none":
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)
