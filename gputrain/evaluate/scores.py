"""What a model said about each held-out sample, kept for the report and `gputrain evaluate`:
class probabilities (classification) or predictions (regression), with the true targets.

Kept on the host, at most MAX_ROWS samples (a seeded, evenly spread subset of a larger split), so
the file stays a few MB whatever the split's size: `scores-<split>.npz` in the run directory.
Language models keep none: a vocabulary-wide distribution per token is not a picture anyone reads.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

KEEPS_SCORES = ("classification", "regression")
_ARRAYS = ("task", "scores", "targets", "total")
"""What a scores file holds (save_scores), and nothing else."""
MAX_ROWS = 20_000
"""Samples kept per split: ROC/PR curves and a confusion matrix are exact at this size for the
splits users evaluate, and a larger split keeps a uniform sample of it."""


@dataclass(frozen=True, slots=True)
class Scores:
    task: str
    """classification or regression."""
    scores: np.ndarray
    """[N, C] class probabilities, or [N, K] predictions."""
    targets: np.ndarray
    """[N] class indices, or [N, K] true values."""
    total: int
    """Samples in the split (N is at most MAX_ROWS of them)."""


class ScoreKeeper:
    """Collects a split's outputs batch by batch (one copy to the host per batch: evaluation only)."""

    def __init__(self, task: str) -> None:
        self.task = task
        self._scores: list[torch.Tensor] = []
        self._targets: list[torch.Tensor] = []

    def add(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        if self.task == "classification":
            kept = outputs.float().softmax(dim=-1)
        else:
            kept = outputs.float().reshape(len(outputs), -1)
            targets = targets.float().reshape(len(targets), -1)
        self._scores.append(kept.detach().cpu())
        self._targets.append(targets.detach().cpu())

    def result(self) -> Scores | None:
        if not self._scores:
            return None
        scores, targets = torch.cat(self._scores).numpy(), torch.cat(self._targets).numpy()
        return _at_most_max_rows(self.task, scores, targets, len(scores))


def merge(parts: list[Scores | None]) -> Scores | None:
    """The scores of a split that ranks evaluated in shares (each its own part)."""
    found = [p for p in parts if p is not None]
    if not found:
        return None
    scores = np.concatenate([p.scores for p in found])
    targets = np.concatenate([p.targets for p in found])
    return _at_most_max_rows(found[0].task, scores, targets, sum(p.total for p in found))


def _at_most_max_rows(task: str, scores: np.ndarray, targets: np.ndarray, total: int) -> Scores:
    """The scores of a split of `total` samples, of which MAX_ROWS rows at most are kept (a seeded,
    evenly spread subset)."""
    if len(scores) > MAX_ROWS:
        keep = np.sort(np.random.default_rng(0).choice(len(scores), MAX_ROWS, replace=False))
        scores, targets = scores[keep], targets[keep]
    return Scores(task, scores, targets, total)


def save_scores(path: Path, scores: Scores) -> None:
    """Write `scores` to `path` (.npz), atomically."""
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez_compressed(
        tmp, task=np.array(scores.task), scores=scores.scores, targets=scores.targets, total=np.array(scores.total)
    )
    tmp.replace(path)


def is_scores_file(path: Path) -> bool:
    """Whether `path` is a scores file gputrain wrote (an .npz of exactly save_scores' arrays): the
    only file `gputrain evaluate` writes scores over (run/output.py)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return sorted(archive.namelist()) == sorted(f"{name}.npy" for name in _ARRAYS)
    except (OSError, zipfile.BadZipFile):
        return False


def load_scores(path: Path | BinaryIO) -> Scores:
    """Read a `scores-<split>.npz`, or its bytes (plain arrays only: no pickled objects are allowed in)."""
    with np.load(path, allow_pickle=False) as data:
        return Scores(str(data["task"]), data["scores"], data["targets"], int(data["total"]))
