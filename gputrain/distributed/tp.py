"""Tensor parallelism with DTensor: split a model's layers over the tp ranks by the plan it is given.

A plan maps module names to how each is split (torch.distributed.tensor.parallel's ColwiseParallel,
RowwiseParallel, SequenceParallel, ...). It is the model's to know: the built-in families keep theirs
beside their code (models/plans.py finds them), and a user's model comes with its own. This module
knows nothing of any model's layout; it applies the plan and keeps tied weights tied.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from gputrain.models.meta import shared_parameters


def apply_tp(model: nn.Module, mesh: DeviceMesh, plan: Mapping[str, ParallelStyle]) -> nn.Module:
    """Split `model`'s modules over the 1-D tp mesh as `plan` says, in place."""
    ties = [names for names, _ in shared_parameters(model)]
    parallelize_module(model, mesh, dict(plan))
    for (owner, owner_name), *aliases in ties:  # sharding replaced each module's Parameter: re-tie the aliases
        for module, name in aliases:
            setattr(module, name, getattr(owner, owner_name))
    return model
