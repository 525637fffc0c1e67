"""Evaluation of a split during and after training: the evaluator and early stopping (`evaluator`),
the metrics it computes (`metrics`), how the ranks share a split (`layout`, decided once per job,
and `shares`), the scores kept for the
report's curves (`scores`), and the first batch tried before a split is run (`probe`).

Its names are imported on first use (gputrain/lazy.py)."""

from __future__ import annotations

from gputrain.lazy import lazy_exports

_EXPORTS = {
    "EarlyStopping": "evaluator",
    "EvalLayout": "layout",
    "EvalSpec": "evaluator",
    "Evaluation": "evaluator",
    "Evaluator": "evaluator",
    "eval_layout": "layout",
    "evaluate_split": "evaluator",
    "EvalMetrics": "metrics",
    "Scores": "scores",
    "load_scores": "scores",
    "save_scores": "scores",
}
__all__ = sorted(_EXPORTS)  # the names `from gputrain.<package> import *` gives
__getattr__ = lazy_exports(__name__, _EXPORTS)
