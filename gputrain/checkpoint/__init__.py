"""Atomic, checksummed checkpoints and their discovery for resume."""

from gputrain.checkpoint.io import (
    CorruptCheckpoint,
    find_resumable,
    list_checkpoints,
    load_checkpoint,
    rotate_checkpoints,
    save_checkpoint,
    save_weights,
    verify_checkpoint,
)

__all__ = [
    "CorruptCheckpoint",
    "find_resumable",
    "list_checkpoints",
    "load_checkpoint",
    "rotate_checkpoints",
    "save_checkpoint",
    "save_weights",
    "verify_checkpoint",
]
