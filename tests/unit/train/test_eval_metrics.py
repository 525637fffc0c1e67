"""Evaluation feeds torchmetrics a few large updates and reuses its metric objects: the figures are
exactly those of one update per batch with metrics built afresh."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gputrain.train import evaluate as evaluate_module
from gputrain.train.evaluate import _build_metrics, evaluate_split

NAMES = ["accuracy", "precision", "recall", "f1", "auroc", "loss"]
CPU = torch.device("cpu")


def _per_batch(model: nn.Module, batches: list, classes: int) -> dict[str, float]:
    """What torchmetrics says when told batch by batch (how gputrain evaluated before)."""
    metrics = _build_metrics(NAMES, "classification", classes, CPU, False)
    with torch.no_grad():
        for inputs, targets in batches:
            outputs = model(inputs).float()
            for name, metric in metrics.items():
                metric.update(outputs.softmax(dim=-1) if name == "auroc" else outputs, targets)
    return {name: float(metric.compute()) for name, metric in metrics.items()}


def _evaluate(model: nn.Module, batches: list, classes: int, metrics: dict | None = None) -> dict[str, float]:
    return evaluate_split(model, batches, task="classification", metric_names=NAMES, loss_fn=F.cross_entropy,
                          num_classes=classes, device=CPU, autocast=contextlib.nullcontext, metrics=metrics)[0]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torchmetrics on the class no target has
@pytest.mark.parametrize(("classes", "samples", "batch"), [(10, 1000, 64), (3, 70, 8), (7, 2100, 16), (5, 200, 300)])
def test_the_figures_are_those_of_per_batch_updates(classes: int, samples: int, batch: int) -> None:
    torch.manual_seed(classes)
    inputs = torch.randn(samples, 12)
    targets = torch.randint(0, classes - 1, (samples,))  # the last class never occurs
    model = nn.Linear(12, classes)
    batches = [(inputs[i : i + batch], targets[i : i + batch]) for i in range(0, samples, batch)]
    assert len(batches) > evaluate_module._FLUSH_EVERY or samples < 2000  # the 2,100 case flushes mid-split
    got = _evaluate(model, batches, classes)
    expected = _per_batch(model, batches, classes)
    assert {k: got[k] for k in expected} == expected  # equal, not close


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_metrics_reused_across_evaluations_start_from_nothing() -> None:
    torch.manual_seed(0)
    batches = [(torch.randn(32, 6), torch.randint(0, 4, (32,))) for _ in range(5)]
    shared = _build_metrics(NAMES, "classification", 4, CPU, False)
    for seed in range(3):  # a different model each time, as training moves the weights
        torch.manual_seed(seed)
        model = nn.Linear(6, 4)
        assert _evaluate(model, batches, 4, metrics=shared) == _evaluate(model, batches, 4)


def test_outputs_torchmetrics_would_refuse_are_still_refused() -> None:
    model = nn.Linear(6, 5)  # 5 scores for a 4-class task
    batches = [(torch.randn(8, 6), torch.randint(0, 4, (8,)))]
    with pytest.raises(ValueError, match="number of classes"):
        evaluate_split(model, batches, task="classification", metric_names=["accuracy"], loss_fn=None,
                       num_classes=4, device=CPU, autocast=contextlib.nullcontext)
