"""What the model learned, by task: for classification the test split's confusion matrix, per-class
figures and ROC / precision-recall curves; for regression predicted against true and the
residuals; for language models the perplexity. One run in detail, or several side by side."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gputrain.report.classify import ClassReport, classification_report, curves_to_draw
from gputrain.report.escape import esc
from gputrain.report.page import Cell, Row, facts, num, plots, table
from gputrain.report.regress import MAX_OUTPUTS, RegressionReport, regression_report
from gputrain.report.rundir import Run
from gputrain.report.series import downsample, ema_span, smooth
from gputrain.report.svg import Figure, Line, color, heatmap, histogram, line_chart, scatter

MAX_MATRIX_CLASSES = 30
"""A confusion matrix of more classes is unreadable: the classes most often confused are shown."""


def _sampled_note(samples: int, total: int) -> str:
    if total > samples:
        return f"{samples:,} of the test split's {total:,} samples (a uniform sample, saved by the run)"
    return f"all {samples:,} test samples"


def _matrix_subset(report: ClassReport) -> tuple[np.ndarray, list[int], str]:
    """The confusion matrix, or its MAX_MATRIX_CLASSES most confused classes where there are more."""
    k = report.num_classes
    if k <= MAX_MATRIX_CLASSES:
        return report.confusion, list(range(k)), ""
    errors = report.confusion.sum(axis=1) + report.confusion.sum(axis=0) - 2 * np.diag(report.confusion)
    keep = sorted(np.argsort(-errors, kind="stable")[:MAX_MATRIX_CLASSES].tolist())
    note = f"the {MAX_MATRIX_CLASSES} classes of {k} with the most errors (as true or predicted class)"
    return report.confusion[np.ix_(keep, keep)], keep, note


def _unit_square_chart(
    title: str, lines: Sequence[Line], *, x_label: str, y_label: str, diagonal: bool = False, note: str = ""
) -> Figure:
    """Curves of rates in [0, 1] on both axes (ROC, precision-recall)."""
    return line_chart(
        title,
        lines,
        x_label=x_label,
        y_label=y_label,
        x_range=(0.0, 1.0),
        y_range=(0.0, 1.02),
        y_log=False,
        diagonal=diagonal,
        note=note,
    )


def _roc_chart(title: str, lines: Sequence[Line], note: str = "") -> Figure:
    return _unit_square_chart(
        title, lines, x_label="false positive rate", y_label="true positive rate", diagonal=True, note=note
    )


def classification_figures(report: ClassReport) -> list[Figure]:
    drawn, note = curves_to_draw(report)
    roc = [Line(f"class {c.label} (AUC {c.auc:.4f})", c.roc_fpr, c.roc_tpr, color(i)) for i, c in enumerate(drawn)]
    if report.num_classes > 2:
        roc.append(
            Line(f"micro-average (AUC {report.micro_auc:.4f})", report.micro_fpr, report.micro_tpr, "#333", dash="6 3")
        )
    pr = [
        Line(f"class {c.label} (AP {c.average_precision:.4f})", c.pr_recall, c.pr_precision, color(i))
        for i, c in enumerate(drawn)
    ]
    figures = [
        _roc_chart("ROC curves (one class against the rest)", roc, note),
        _unit_square_chart("precision-recall curves", pr, x_label="recall", y_label="precision", note=note),
    ]
    counts, classes, matrix_note = _matrix_subset(report)
    figures.append(
        heatmap(
            "confusion matrix (shade: share of the true class)",
            counts,
            [str(c) for c in classes],
            x_label="predicted class",
            y_label="true class",
            note=matrix_note,
        )
    )
    return figures


def _class_table(report: ClassReport) -> str:
    by_label = {c.label: c for c in report.curves}
    rows: list[Row] = []
    for k in range(report.num_classes):
        curve = by_label.get(k)
        rows.append(
            [
                Cell(str(k), float(k)),
                num(float(report.precision[k])),
                num(float(report.recall[k])),
                num(float(report.f1[k])),
                Cell(f"{int(report.support[k]):,}", float(report.support[k])),
                num(curve.auc if curve else None),
                num(curve.average_precision if curve else None),
            ]
        )
    return table(["class", "precision", "recall", "F1", "support", "ROC AUC", "average precision"], rows)


def classification_html(run: Run) -> str:
    assert run.scores is not None
    report = classification_report(run.scores)
    headline = [
        ("accuracy", f"{report.accuracy:.4f}"),
        ("macro ROC AUC", f"{report.macro_auc:.4f}" if report.macro_auc is not None else "–"),
        ("micro ROC AUC", f"{report.micro_auc:.4f}" if math.isfinite(report.micro_auc) else "–"),
        ("macro F1", f"{float(np.mean(report.f1)):.4f}"),
        ("classes", str(report.num_classes)),
    ]
    missing = report.missing
    note = _sampled_note(report.samples, report.total) + (
        f"; no curve for class {', '.join(map(str, missing))} (none of them, or only them, among the samples)"
        if missing and report.num_classes > 2
        else ""
    )
    return (
        facts(headline)
        + f'<p class="note">From scores-test.npz: {esc(note)}.</p>'
        + plots(classification_figures(report))
        + "<h3>per class</h3>"
        + _class_table(report)
    )


def regression_figures(report: RegressionReport) -> list[Figure]:
    figures = []
    outputs = report.predicted.shape[1]
    for k in range(min(outputs, MAX_OUTPUTS)):
        suffix = f" (output {k})" if outputs > 1 else ""
        pred, true = report.predicted[report.drawn, k], report.true[report.drawn, k]
        note = (
            f"{len(report.drawn):,} of {len(report.predicted):,} samples drawn"
            if len(report.drawn) < len(report.predicted)
            else ""
        )
        figures.append(
            scatter(
                f"predicted against true{suffix}",
                true,
                pred,
                x_label="true",
                y_label="predicted",
                diagonal=True,
                note=note,
            )
        )
        residual = report.predicted[:, k] - report.true[:, k]
        figures.append(histogram(f"residuals (predicted − true){suffix}", residual, x_label="residual"))
    return figures


def regression_html(run: Run) -> str:
    assert run.scores is not None
    report = regression_report(run.scores)
    rows: list[Row] = [
        [Cell(str(e.index), float(e.index)), num(e.mse), num(e.mae), num(e.r2), num(math.sqrt(e.mse))]
        for e in report.errors
    ]
    return (
        f'<p class="note">From scores-test.npz: {esc(_sampled_note(len(report.predicted), report.total))}.</p>'
        + plots(regression_figures(report))
        + table(["output", "MSE", "MAE", "R²", "RMSE"], rows)
    )


def perplexity_figure(runs: Sequence[Run]) -> Figure | None:
    """exp(smoothed training loss): the perplexity a language model's loss means, per run."""
    lines = []
    for i, run in enumerate(runs):
        steps, loss = run.steps.get("step"), run.steps.get("loss")
        if steps is None or loss is None:
            continue
        with np.errstate(over="ignore"):
            xs, ys = downsample(steps, np.exp(smooth(loss, ema_span(len(loss)))))
        lines.append(Line(run.name if len(runs) > 1 else "exp(smoothed loss)", xs, ys, color(i), width=1.8))
    if not lines:
        return None
    return line_chart("training perplexity", lines, x_label="step", y_label="perplexity")


def outcome_html(run: Run) -> str:
    """The test split of one run, as its task calls for."""
    if run.sweep_only:
        return ""
    task = run.task
    if task == "lm":
        figure = perplexity_figure([run])
        return (
            '<p class="note">Language model: evaluation loss and perplexity are under Evaluation; '
            "no per-token scores are kept.</p>" + (plots([figure]) if figure else "")
        )
    if run.scores is None:
        if task in ("classification", "regression"):
            why = "the run has not reached its test evaluation" if not run.complete else "the run had no test split"
            return f'<p class="note">No scores-test.npz: {esc(why)}.</p>'
        return ""
    if run.scores.task == "classification":
        return classification_html(run)
    return regression_html(run)


def compare_outcomes_html(runs: Sequence[Run]) -> str:
    """Runs side by side on their test scores: micro-average ROC curves and AUCs (classification),
    errors (regression). Runs of other tasks, or without scores, are left out of these."""
    parts = []
    classified = [r for r in runs if r.scores is not None and r.scores.task == "classification"]
    if classified:
        reports = [(r, classification_report(r.scores)) for r in classified if r.scores is not None]
        lines = [
            Line(f"{r.name} (AUC {rep.micro_auc:.4f})", rep.micro_fpr, rep.micro_tpr, color(runs.index(r)))
            for r, rep in reports
        ]
        figure = _roc_chart("ROC, micro-average over classes", lines)
        rows: list[Row] = [
            [
                r.name,
                num(rep.accuracy),
                num(rep.macro_auc),
                num(rep.micro_auc),
                num(float(np.mean(rep.f1))),
                Cell(f"{rep.samples:,}", float(rep.samples)),
            ]
            for r, rep in reports
        ]
        parts.append(
            plots([figure]) + table(["run", "accuracy", "macro AUC", "micro AUC", "macro F1", "test samples"], rows)
        )
    regressed = [r for r in runs if r.scores is not None and r.scores.task == "regression"]
    if regressed:
        error_rows: list[Row] = []
        for r in regressed:
            assert r.scores is not None
            for e in regression_report(r.scores).errors:
                error_rows.append([r.name, Cell(str(e.index), float(e.index)), num(e.mse), num(e.mae), num(e.r2)])
        parts.append("<h3>regression</h3>" + table(["run", "output", "MSE", "MAE", "R²"], error_rows))
    lm = [r for r in runs if r.task == "lm"]
    if lm:
        perplexity = perplexity_figure(lm)
        parts.append(plots([perplexity]) if perplexity else "")
    return "".join(parts)
