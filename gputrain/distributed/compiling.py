"""torch.compile applied in place, to the whole model or block by block, and taken off again.

Each compiled module keeps its own name and class (state-dict keys get no `_orig_mod.` prefix) and its
hooks stay outside the graph (FSDP's gathers between blocks). The module's `forward` is replaced on the
instance by a compiled copy of its class's forward, bound to it. Not `nn.Module.compile()`: that one
silently runs eagerly for torch's own module classes (an nn.Sequential, nn.TransformerEncoderLayer, a
Linear: no graph is made, with torch 2.13), which are what many models and block stacks are built of.
Bound per instance, a deep copy of the module (EMA, a copy to export) calls its own forward.

The scope (`CompileScope`): the whole model where nothing wraps its blocks, as nanoGPT and the hand
loop of benchmarks/gpu_gpt2.py compile it: one graph, so the embedding, the final norm and the head
fuse with the blocks instead of running eagerly between compiled regions (18 more host ops a GPT
step, benchmarks/step_anatomy.py). Block by block where something sits between the blocks: FSDP's
gathers and activation checkpointing's wrappers (a graph spanning them would trace them), tensor
parallelism's redistributions (torchtitan compiles each block under TP too) and a pipeline stage.
"""

from __future__ import annotations

import types
from typing import Literal

import torch
from torch import nn

from gputrain.distributed.blocks import find_block_stack, find_blocks

CompileScope = Literal["model", "blocks", "children"]
"""model: one compiled forward for the whole model. blocks: each block of a transformer-style stack
(the rest of the model eager), else the whole model. children: blocks, and each child of an
nn.Sequential too (FSDP shards them one by one and activation checkpointing wraps each)."""


def compile_in_place(model: nn.Module, mode: str | None = None, scope: CompileScope = "model") -> None:
    """Compile `model`'s forward, or its blocks' (`scope`; each block compiles once, the rest reuse its
    code). mode="reduce-overhead" also captures the compiled code in CUDA graphs (train.cuda_graphs)."""
    blocks: list[nn.Module] = []
    if scope == "children" or (scope == "blocks" and find_block_stack(model) is not None):
        blocks = [block for _, block in find_blocks(model)]
    for module in blocks or [model]:
        compiled = torch.compile(type(module).forward, mode=mode)
        module.forward = types.MethodType(compiled, module)


def remove_compile(model: nn.Module) -> None:
    """Every module of `model` runs its class's own forward again, eagerly."""
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, types.MethodType) and forward.__func__ is not type(module).forward:
            del module.forward
