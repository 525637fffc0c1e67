"""The evaluation metrics are computed with torch alone (evaluate/metrics.py); scikit-learn is the
reference for every figure, on splits with ties, absent classes and many flushes of the state."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import (
    accuracy_score,
    f1_score,
    mean_absolute_error,
    mean_squared_error,
    precision_score,
    recall_score,
    roc_auc_score,
)
from torch import nn

from gputrain.evaluate.metrics import EvalMetrics
from gputrain.evaluate.evaluator import EvalSpec, SplitPass, evaluate_split
from gputrain.train.tasks import Task

NAMES = ["accuracy", "precision", "recall", "f1", "auroc", "loss"]
CPU = torch.device("cpu")


def _sklearn(scores: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    """scikit-learn's figures: macro averages over its default labels (those in targets or
    predictions), AUROC one-vs-rest over the classes that have positives and negatives."""
    predicted = scores.argmax(axis=1)
    aucs = [
        roc_auc_score(targets == k, scores[:, k])
        for k in range(scores.shape[1])
        if 0 < (targets == k).sum() < len(targets)
    ]
    return {
        "accuracy": accuracy_score(targets, predicted),
        "precision": precision_score(targets, predicted, average="macro", zero_division=0),
        "recall": recall_score(targets, predicted, average="macro", zero_division=0),
        "f1": f1_score(targets, predicted, average="macro", zero_division=0),
        "auroc": float(np.mean(aucs)),
    }


def _evaluate(model: nn.Module, batches: list, classes: int, metrics: EvalMetrics | None = None) -> dict[str, float]:
    spec = EvalSpec(Task("classification", F.cross_entropy, classes), NAMES, contextlib.nullcontext)
    return evaluate_split(model, batches, spec, SplitPass(CPU), metrics=metrics)[0]


@pytest.mark.parametrize(("classes", "samples", "batch"), [(10, 1000, 64), (3, 70, 8), (7, 2100, 16), (5, 200, 300),
                                                           (2, 500, 32)])
def test_the_figures_are_scikit_learns(classes: int, samples: int, batch: int) -> None:
    torch.manual_seed(classes)
    inputs = torch.randn(samples, 12)
    targets = torch.randint(0, max(2, classes - 1), (samples,))  # with 3+ classes, the last never occurs
    model = nn.Linear(12, classes)
    batches = [(inputs[i : i + batch], targets[i : i + batch]) for i in range(0, samples, batch)]
    got = _evaluate(model, batches, classes)
    with torch.no_grad():
        logits = model(inputs)
    expected = _sklearn(logits.softmax(dim=-1).numpy(), targets.numpy())
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-9), name
    assert got["loss"] == pytest.approx(float(F.cross_entropy(logits, targets)), rel=1e-6)


def test_tied_scores_count_half_as_the_roc_trapezoid_does() -> None:
    # scores on a coarse grid: many ties within each class's column, between positives and negatives
    generator = torch.Generator().manual_seed(3)
    logits = torch.randint(0, 3, (400, 4), generator=generator).float()
    targets = torch.randint(0, 4, (400,), generator=generator)
    metrics = EvalMetrics(["auroc", "accuracy"], "classification", 4, CPU)
    for i in range(0, 400, 50):
        metrics.update(logits[i : i + 50], targets[i : i + 50])
    got = metrics.compute()
    expected = _sklearn(logits.softmax(dim=-1).numpy(), targets.numpy())
    assert got["auroc"] == pytest.approx(expected["auroc"], abs=1e-12)
    # argmax on ties takes the first class, as numpy's does
    assert got["accuracy"] == pytest.approx(expected["accuracy"], abs=1e-12)


def test_a_class_neither_predicted_nor_present_is_left_out_of_the_averages() -> None:
    torch.manual_seed(1)
    logits, targets = torch.randn(200, 5), torch.randint(0, 4, (200,))
    logits[:, 4] = -50.0  # class 4: never a target, never predicted
    metrics = EvalMetrics(["precision", "recall", "f1", "auroc"], "classification", 5, CPU)
    metrics.update(logits, targets)
    got = metrics.compute()
    expected = _sklearn(logits.softmax(dim=-1).numpy(), targets.numpy())
    assert got == pytest.approx({k: expected[k] for k in got}, abs=1e-12)
    assert got["recall"] > 0.2  # averaged over 4 classes, not 5


def test_segmentation_shaped_outputs_are_scored_per_position() -> None:
    torch.manual_seed(0)
    logits, targets = torch.randn(6, 3, 5, 4), torch.randint(0, 3, (6, 5, 4))
    metrics = EvalMetrics(["accuracy", "f1", "auroc"], "classification", 3, CPU)
    metrics.update(logits, targets)
    flat = logits.movedim(1, -1).reshape(-1, 3)
    expected = _sklearn(flat.softmax(dim=-1).numpy(), targets.reshape(-1).numpy())
    assert metrics.compute() == pytest.approx({k: expected[k] for k in ("accuracy", "f1", "auroc")}, abs=1e-12)


def test_regression_figures_are_scikit_learns() -> None:
    torch.manual_seed(0)
    predictions, targets = torch.randn(300, 1), torch.randn(300)
    metrics = EvalMetrics(["mse", "mae"], "regression", None, CPU)
    for i in range(0, 300, 7):
        metrics.update(predictions[i : i + 7], targets[i : i + 7])
    got = metrics.compute()
    truth, predicted = targets.double().numpy(), predictions.view(-1).double().numpy()  # sums in float64, as ours
    assert got["mse"] == pytest.approx(mean_squared_error(truth, predicted), rel=1e-12)
    assert got["mae"] == pytest.approx(mean_absolute_error(truth, predicted), rel=1e-12)


def test_metrics_reused_across_evaluations_start_from_nothing() -> None:
    torch.manual_seed(0)
    batches = [(torch.randn(32, 6), torch.randint(0, 4, (32,))) for _ in range(5)]
    shared = EvalMetrics(NAMES, "classification", 4, CPU)
    for seed in range(3):  # a different model each time, as training moves the weights
        torch.manual_seed(seed)
        model = nn.Linear(6, 4)
        assert _evaluate(model, batches, 4, metrics=shared) == _evaluate(model, batches, 4)


def test_outputs_of_the_wrong_class_count_are_refused_by_name() -> None:
    model = nn.Linear(6, 5)  # 5 scores for a 4-class task
    batches = [(torch.randn(8, 6), torch.randint(0, 4, (8,)))]
    with pytest.raises(ValueError, match=r"need outputs \[N, 4, \.\.\.\] .* got outputs \(8, 5\) and targets \(8,\)"):
        evaluate_split(model, batches, EvalSpec(Task("classification", None, 4), ["accuracy"], contextlib.nullcontext),
                       SplitPass(CPU))


def test_targets_that_are_not_class_indices_are_refused_at_the_end() -> None:
    metrics = EvalMetrics(["accuracy"], "classification", 3, CPU)
    metrics.update(torch.randn(4, 3), torch.tensor([0, 1, 2, 3]))
    metrics.update(torch.randn(2, 3), torch.tensor([-1, 1]))
    with pytest.raises(ValueError, match=r"2 evaluation targets are not class indices 0\.\.2 of this 3-class task"):
        metrics.compute()


def test_evaluating_imports_neither_torchmetrics_nor_torchvision(tmp_path) -> None:
    # importing torchmetrics cost 0.5-1.4 s of the default job, and a torchvision built for another
    # torch broke it after a whole epoch: the evaluation needs torch alone
    code = (
        "import sys, torch\n"
        "from torch.utils.data import TensorDataset\n"
        "from gputrain import Trainer\n"
        "x = torch.randn(64, 5); y = torch.randint(0, 3, (64,))\n"
        "t = Trainer(torch.nn.Linear(5, 3), TensorDataset(x, y), val_data=TensorDataset(x, y),"
        f" run_dir={str(tmp_path)!r},"
        " config={'train.epochs': 1, 'log.progress': 'none', 'checkpoint.enabled': False})\n"
        "s = t.fit()\n"
        "assert set(s['val']) >= {'accuracy', 'auroc', 'f1'}, s['val']\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torchmetrics', 'torchvision')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("tied", [False, True])
def test_auroc_on_the_host_gives_the_tensor_paths_figure(tied: bool) -> None:
    """CPU scores take numpy, other devices tensor ops (evaluate/metrics.py): the same figure, ties or not."""
    from gputrain.evaluate import metrics as eval_metrics

    torch.manual_seed(4)
    logits = torch.randint(0, 3, (600, 5)).float() if tied else torch.randn(3000, 12)
    scores, targets = logits.softmax(dim=1), torch.randint(0, logits.shape[1] - 1, (len(logits),))
    k = logits.shape[1]
    on_host = eval_metrics._auroc_on_host(scores, targets, k)
    assert on_host == float(eval_metrics._macro_auroc(scores, targets, k))  # what a CPU evaluation takes
    assert on_host == pytest.approx(float(eval_metrics._auroc_on_device(scores, targets, k)), abs=1e-12)
    expected = np.mean([roc_auc_score(targets.numpy() == c, scores[:, c].numpy()) for c in range(k - 1)])
    assert on_host == pytest.approx(expected, abs=1e-12)
