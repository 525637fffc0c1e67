"""What a classifier's saved test scores say: the confusion matrix, precision, recall and F1 per
class, and one-vs-rest ROC and precision-recall curves with their areas.

The figures are scikit-learn's own (`roc_curve`, `roc_auc_score`, `precision_recall_curve`,
`average_precision_score`, `precision_recall_fscore_support`) on the scores the run saved, so they
are the numbers a user would get by loading scores-test.npz themselves; only the drawn curves are
thinned (series.thin_curve), never the areas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gputrain.evaluate.scores import Scores
from gputrain.report.series import thin_curve


@dataclass(frozen=True, slots=True)
class ClassCurve:
    """One class against the rest."""

    label: int
    roc_fpr: np.ndarray
    roc_tpr: np.ndarray
    auc: float
    pr_recall: np.ndarray
    pr_precision: np.ndarray
    average_precision: float


@dataclass(frozen=True, slots=True)
class ClassReport:
    num_classes: int
    samples: int
    total: int
    """Samples in the test split (`samples` of them were kept, a uniform sample of a larger split)."""
    confusion: np.ndarray
    """[C, C] counts: rows the true class, columns the predicted one."""
    precision: np.ndarray
    recall: np.ndarray
    f1: np.ndarray
    support: np.ndarray
    accuracy: float
    curves: list[ClassCurve]
    """Classes with both positives and negatives among the samples (others have no ROC curve)."""
    macro_auc: float | None
    micro_fpr: np.ndarray
    micro_tpr: np.ndarray
    micro_auc: float

    @property
    def missing(self) -> list[int]:
        """Classes without a curve: absent from the sampled test split (or the only class in it)."""
        have = {c.label for c in self.curves}
        return [k for k in range(self.num_classes) if k not in have]


def classification_report(scores: Scores) -> ClassReport:
    """The report of [N, C] class probabilities against [N] true classes (C = 2 included)."""
    from sklearn.metrics import (
        average_precision_score,
        confusion_matrix,
        precision_recall_curve,
        precision_recall_fscore_support,
        roc_auc_score,
        roc_curve,
    )

    probs = np.asarray(scores.scores, dtype=float)
    targets = np.asarray(scores.targets).astype(int).reshape(-1)
    num_classes = probs.shape[1]
    labels = list(range(num_classes))
    predicted = probs.argmax(axis=1)
    precision, recall, f1, support = precision_recall_fscore_support(targets, predicted, labels=labels, zero_division=0)
    curves = []
    for k in labels:
        positives = targets == k
        if positives.all() or not positives.any():
            continue
        fpr, tpr, _ = roc_curve(positives, probs[:, k])
        rec_precision, rec_recall, _ = precision_recall_curve(positives, probs[:, k])
        curves.append(
            ClassCurve(
                k,
                *thin_curve(fpr, tpr),
                float(roc_auc_score(positives, probs[:, k])),
                *thin_curve(rec_recall, rec_precision),
                float(average_precision_score(positives, probs[:, k])),
            )
        )
    onehot = (targets[:, None] == np.arange(num_classes)[None, :]).ravel()
    micro_fpr, micro_tpr = thin_curve(*roc_curve(onehot, probs.ravel())[:2])
    return ClassReport(
        num_classes=num_classes,
        samples=len(targets),
        total=scores.total,
        confusion=confusion_matrix(targets, predicted, labels=labels),
        precision=np.asarray(precision, dtype=float),
        recall=np.asarray(recall, dtype=float),
        f1=np.asarray(f1, dtype=float),
        support=np.asarray(support, dtype=int),
        accuracy=float((predicted == targets).mean()) if len(targets) else float("nan"),
        curves=curves,
        macro_auc=float(np.mean([c.auc for c in curves])) if curves else None,
        micro_fpr=micro_fpr,
        micro_tpr=micro_tpr,
        micro_auc=float(roc_auc_score(onehot, probs.ravel())) if 0 < onehot.sum() < onehot.size else float("nan"),
    )


def curves_to_draw(report: ClassReport, limit: int = 10) -> tuple[list[ClassCurve], str]:
    """The per-class curves a plot can hold: all of up to `limit` classes, else the `limit` with
    the lowest AUC (the ones worth looking at), with a note saying so."""
    curves = report.curves
    if report.num_classes == 2:  # one curve tells it all: class 1 against class 0
        return [c for c in curves if c.label == 1] or curves[:1], "class 1 against class 0"
    if len(curves) <= limit:
        return curves, ""
    worst = sorted(curves, key=lambda c: c.auc)[:limit]
    return sorted(worst, key=lambda c: c.label), f"the {limit} classes of lowest AUC of {len(curves)}"
