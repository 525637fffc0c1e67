"""torch.compile applied in place, block by block where the model has blocks, and taken off again.

Each compiled module keeps its own name and class (state-dict keys get no `_orig_mod.` prefix) and its
hooks stay outside the graph (FSDP's gathers between blocks). The module's `forward` is replaced on the
instance by a compiled copy of its class's forward, bound to it. Not `nn.Module.compile()`: that one
silently runs eagerly for torch's own module classes (an nn.Sequential, nn.TransformerEncoderLayer, a
Linear: no graph is made, with torch 2.13), which are what many models and block stacks are built of.
Bound per instance, a deep copy of the module (EMA, a copy to export) calls its own forward.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from gputrain.distributed.blocks import find_block_stack, find_blocks


def compile_in_place(model: nn.Module, mode: str | None = None, per_block: bool = False) -> None:
    """Compile the blocks of a transformer-style stack (each compiles once, the rest reuse its code),
    else the whole model; `per_block`: each child of an nn.Sequential too (FSDP shards them one by one
    and activation checkpointing wraps each: a graph spanning them would trace those). mode=
    "reduce-overhead" also captures the compiled code in CUDA graphs (train.cuda_graphs)."""
    stack = find_block_stack(model)
    blocks = [block for _, block in find_blocks(model)] if stack is not None or per_block else []
    for module in blocks or [model]:
        compiled = torch.compile(type(module).forward, mode=mode)
        module.forward = types.MethodType(compiled, module)


def remove_compile(model: nn.Module) -> None:
    """Every module of `model` runs its class's own forward again, eagerly."""
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, types.MethodType) and forward.__func__ is not type(module).forward:
            del module.forward
