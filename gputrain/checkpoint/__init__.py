"""Atomic, checksummed checkpoints, their discovery for resume, and the check that one is this run's."""

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
from gputrain.checkpoint.matching import CheckpointMismatch

__all__ = [
    "CheckpointMismatch",
    "CorruptCheckpoint",
    "find_resumable",
    "list_checkpoints",
    "load_checkpoint",
    "rotate_checkpoints",
    "save_checkpoint",
    "save_weights",
    "verify_checkpoint",
]
