"""What each task means for the loop: its default loss, its metrics and which way they improve."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

DEFAULT_METRICS = {
    "classification": ["accuracy", "precision", "recall", "f1", "auroc", "loss"],
    "regression": ["mse", "mae", "loss"],
    "lm": ["loss", "perplexity"],
}
_LOWER_IS_BETTER = {"loss", "mse", "mae", "perplexity"}


def lm_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token loss: logits [B, T, V] against targets [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def _regression_mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(outputs.float(), targets.float().view_as(outputs))


def default_loss(task: str) -> LossFn:
    if task == "classification":
        return F.cross_entropy
    if task == "regression":
        return _regression_mse
    return lm_cross_entropy


def infer_task(outputs: torch.Tensor, targets: torch.Tensor) -> str | None:
    """Guess the task from one batch (for the Python API with user models); None when unclear."""
    if not isinstance(outputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        return None
    if targets.is_floating_point():
        return "regression"
    if outputs.dim() == 2 and targets.dim() == 1:
        return "classification"
    if outputs.dim() == 3 and targets.dim() == 2:
        return "lm"
    return None


def metric_mode(metric: str, mode: str = "auto") -> str:
    """'min' or 'max': which direction is an improvement for this metric."""
    if mode != "auto":
        return mode
    return "min" if metric in _LOWER_IS_BETTER else "max"
