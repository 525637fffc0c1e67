"""What a regression model's saved test predictions say: predicted against true, the residuals,
and the errors as numbers (per output, for a model with several)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gputrain.evaluate.scores import Scores

MAX_POINTS = 2000
"""Points drawn in a scatter: more only blacken the plot (and grow the file); the errors are
computed on every saved sample."""
MAX_OUTPUTS = 4
"""Outputs drawn for a model with several; the table lists them all."""


@dataclass(frozen=True, slots=True)
class OutputErrors:
    index: int
    mse: float
    mae: float
    r2: float | None
    """None where the true values do not vary (R² is undefined)."""


@dataclass(frozen=True, slots=True)
class RegressionReport:
    predicted: np.ndarray
    """[N, K]"""
    true: np.ndarray
    """[N, K]"""
    total: int
    errors: list[OutputErrors]
    drawn: np.ndarray
    """Indices of the samples drawn in the scatter plots (a seeded sample of at most MAX_POINTS)."""


def regression_report(scores: Scores) -> RegressionReport:
    predicted = np.asarray(scores.scores, dtype=float).reshape(len(scores.scores), -1)
    true = np.asarray(scores.targets, dtype=float).reshape(len(scores.targets), -1)
    errors = []
    for k in range(predicted.shape[1]):
        residual = predicted[:, k] - true[:, k]
        spread = float(((true[:, k] - true[:, k].mean()) ** 2).sum())
        r2 = 1 - float((residual**2).sum()) / spread if spread > 0 else None
        errors.append(OutputErrors(k, float((residual**2).mean()), float(np.abs(residual).mean()), r2))
    n = len(predicted)
    drawn = np.arange(n) if n <= MAX_POINTS else np.sort(np.random.default_rng(0).choice(n, MAX_POINTS, replace=False))
    return RegressionReport(predicted, true, scores.total, errors, drawn)
