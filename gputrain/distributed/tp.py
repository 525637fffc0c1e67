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


def _tied_parameters(model: nn.Module) -> list[tuple[str, str]]:
    """(owner, alias) qualified parameter names that share one Parameter (e.g. embedding and head)."""
    first: dict[int, str] = {}
    ties = []
    for module_name, module in model.named_modules(remove_duplicate=False):
        for pname, param in module.named_parameters(recurse=False, remove_duplicate=False):
            full = f"{module_name}.{pname}" if module_name else pname
            if id(param) in first and first[id(param)] != full:
                ties.append((first[id(param)], full))
            first.setdefault(id(param), full)
    return ties


def apply_tp(model: nn.Module, mesh: DeviceMesh, plan: Mapping[str, ParallelStyle]) -> nn.Module:
    """Split `model`'s modules over the 1-D tp mesh as `plan` says, in place."""
    ties = _tied_parameters(model)
    parallelize_module(model, mesh, dict(plan))
    for owner, alias in ties:  # sharding replaced each module's Parameter: point the alias at the owner again
        module_name, _, pname = alias.rpartition(".")
        setattr(model.get_submodule(module_name), pname, model.get_parameter(owner))
    return model
