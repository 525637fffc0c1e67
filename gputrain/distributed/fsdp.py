"""Fully sharded data parallelism (FSDP2 `fully_shard`): parameters, gradients and optimizer state
are split over the dp_shard ranks; each block's parameters are gathered just before it runs."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from gputrain.distributed.blocks import find_blocks

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}  # fp8: the layers around float8


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """Compute in bf16/fp16 with the parameters gathered in that dtype (half the all-gather bytes), but
    reduce gradients in fp32 so summing over many ranks loses nothing."""
    dtype = _DTYPES.get(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, precision: str = "fp32", cpu_offload: bool = False) -> nn.Module:
    """Shard each block, then the root (which picks up the remaining parameters: embeddings, head).

    `mesh` is 1-D (plain FSDP) or 2-D (replicate, shard): hybrid sharding. The model is changed in
    place (its parameters become DTensors) and returned.
    """
    mp = mixed_precision_policy(precision)
    # pinned host memory speeds the copies to and from an accelerator; a CPU job has none to copy
    # to, and pinning needs one (torch raises "Cannot access accelerator device")
    offload = CPUOffloadPolicy(pin_memory=mesh.device_type != "cpu") if cpu_offload else OffloadPolicy()
    blocks = find_blocks(model)
    for i, (_, block) in enumerate(blocks):
        # the last block's parameters are needed again at once by the backward pass: keep them gathered
        fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    return model


def reshard(model: nn.Module) -> None:
    """Put every FSDP module back to its shards. A forward pass with no backward (evaluation) leaves
    the root module's parameters gathered (FSDP2 does not reshard the root after forward): a state
    dict taken then would hold freed gathered storage instead of the shards."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
