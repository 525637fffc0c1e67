"""Atomic, checksummed checkpoints, their discovery for resume, the one reader of both formats
(`read_checkpoint`), and the check that one is this run's."""

from gputrain.checkpoint.io import (
    CorruptCheckpoint,
    find_resumable,
    list_checkpoints,
    rotate_checkpoints,
    save_checkpoint,
    save_weights,
    verify_checkpoint,
)
from gputrain.checkpoint.matching import CheckpointMismatch
from gputrain.checkpoint.reader import read_checkpoint

__all__ = [
    "CheckpointMismatch",
    "CorruptCheckpoint",
    "find_resumable",
    "list_checkpoints",
    "read_checkpoint",
    "rotate_checkpoints",
    "save_checkpoint",
    "save_weights",
    "verify_checkpoint",
]
