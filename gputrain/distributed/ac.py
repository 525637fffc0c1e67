"""Activation checkpointing: keep fewer activations in the forward pass, recompute them in backward.

full: each block keeps only its input and recomputes everything inside it (least memory,
about one extra forward of compute). selective: inside each block, the outputs of matrix
multiplications and attention are saved and only the cheap element-wise work (activations,
norms, dropout) is recomputed — most of the memory saving of `full` for a few percent of time.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper,
)
from torch.utils.checkpoint import (
    CheckpointPolicy,
    create_selective_checkpoint_contexts,
)

from gputrain.distributed.blocks import find_blocks, replace_module

ACMode = Literal["none", "full", "selective"]

# Ops whose outputs are expensive to recompute: saved under selective checkpointing.
_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.linear.default,
    torch.ops.aten.convolution.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def _selective_policy(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> tuple[object, object]:
    return create_selective_checkpoint_contexts(_selective_policy)


def apply_ac(model: nn.Module, mode: ACMode) -> nn.Module:
    """Wrap every block (see blocks.find_blocks) in a checkpoint wrapper; the model itself if it has none.

    State-dict keys do not change: the wrapper strips its own prefix.
    """
    if mode == "none":
        return model

    def wrap(module: nn.Module) -> nn.Module:
        if mode == "selective":
            return checkpoint_wrapper(module, context_fn=_selective_context)
        return checkpoint_wrapper(module)

    blocks = find_blocks(model)
    if not blocks:
        return wrap(model)
    for name, block in blocks:
        replace_module(model, name, wrap(block))
    return model
