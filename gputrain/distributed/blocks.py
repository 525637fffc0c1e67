"""Find a model's repeated blocks by structure, so parallelism needs nothing from model code.

FSDP shards block by block (one all-gather in flight per block), activation checkpointing
recomputes block by block, and pipeline stages are cut between blocks.
"""

from __future__ import annotations

from torch import nn

# Attribute names under which transformer-style models keep their stack of blocks.
_STACK_NAMES = ("blocks", "layers", "h")


def find_block_stack(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(attribute name, ModuleList) of a transformer-style stack of blocks, or None."""
    for name in _STACK_NAMES:
        stack = getattr(model, name, None)
        if isinstance(stack, nn.ModuleList) and len(stack) > 0:
            return name, stack
    return None


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of each block: the members of a block stack, or for an nn.Sequential
    (the mlp and cnn models) each child that holds parameters. Empty for any other model."""
    stack = find_block_stack(model)
    if stack is not None:
        name, blocks = stack
        return [(f"{name}.{i}", block) for i, block in enumerate(blocks)]
    if isinstance(model, nn.Sequential):
        return [(name, child) for name, child in model.named_children() if any(True for _ in child.parameters())]
    return []


def replace_module(root: nn.Module, qualified_name: str, new: nn.Module) -> None:
    """Put `new` where `qualified_name` was (ModuleList/Sequential children included)."""
    parent_name, _, child = qualified_name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
