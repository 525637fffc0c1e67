"""The classification figures are scikit-learn's on the saved test scores: the AUCs and APs in the
page equal `roc_auc_score` / `average_precision_score`, and every drawn ROC point is a point of
`roc_curve`, from (0, 0) to (1, 1)."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, confusion_matrix, roc_auc_score, roc_curve

from gputrain.evaluate.scores import Scores, load_scores
from gputrain.report.build import write_report
from gputrain.report.classify import classification_report


def _drawn_curves(page: str, title: str) -> dict[str, np.ndarray]:
    """{series name: [n, 2] data points} of the line chart `title`, read back from its SVG pixels."""
    figure = page.split(f"<figcaption>{html.escape(title)}</figcaption>")[1].split("</figure>")[0]
    axes = {a: list(map(float, re.search(rf'data-{a}="([^"]+)"', figure).group(1).split())) for a in "xy"}

    def data(pixels: np.ndarray, axis: list[float]) -> np.ndarray:
        low, high, p0, p1, _ = axis
        return low + (pixels - p0) / (p1 - p0) * (high - low)

    curves = {}
    for name, d in re.findall(r'<path class="series" data-name="([^"]+)" d="([^"]+)"', figure):
        numbers = np.array(re.findall(r"-?[0-9.]+", d), dtype=float).reshape(-1, 2)
        curves[html.unescape(name)] = np.stack([data(numbers[:, 0], axes["x"]), data(numbers[:, 1], axes["y"])], 1)
    return curves


def _table_column(page: str, after: str, column: int) -> list[float]:
    body = page.split(after)[1].split("</table>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body)[1:]
    values = []
    for row in rows:
        cells = re.findall(r"<td([^>]*)>", row)
        values.append(float(re.search(r'data-value="([^"]*)"', cells[column]).group(1)))
    return values


def test_aucs_and_curves_equal_scikit_learns(completed_run, tmp_path):
    run_dir, _ = completed_run
    scores = load_scores(run_dir / "scores-test.npz")
    out = tmp_path / "r.html"
    write_report([run_dir], out)
    page = out.read_text()
    probs, targets = scores.scores, scores.targets
    classes = range(probs.shape[1])
    expected_auc = [roc_auc_score(targets == k, probs[:, k]) for k in classes]
    expected_ap = [average_precision_score(targets == k, probs[:, k]) for k in classes]
    assert _table_column(page, "<h3>per class</h3>", 5) == pytest.approx(expected_auc, abs=1e-12)
    assert _table_column(page, "<h3>per class</h3>", 6) == pytest.approx(expected_ap, abs=1e-12)
    macro = roc_auc_score(targets, probs, multi_class="ovr", average="macro")
    assert f"macro ROC AUC {macro:.4f}" in " ".join(re.sub(r"<[^>]+>", " ", page).split())

    drawn = _drawn_curves(page, "ROC curves (one class against the rest)")
    assert len(drawn) == len(classes) + 1  # each class and the micro-average
    for k in classes:
        points = drawn[f"class {k} (AUC {expected_auc[k]:.4f})"]
        fpr, tpr = roc_curve(targets == k, probs[:, k])[:2]
        exact = np.stack([fpr, tpr], 1)
        # each drawn point is one of scikit-learn's, to the SVG's 0.1-pixel rounding
        gaps = np.abs(points[:, None, :] - exact[None, :, :]).max(axis=2).min(axis=1)
        assert gaps.max() < 2e-3, (k, gaps.max())
        assert points[0] == pytest.approx([0, 0], abs=2e-3) and points[-1] == pytest.approx([1, 1], abs=2e-3)


def test_a_class_missing_from_the_sample_has_no_curve_and_the_rest_are_exact():
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 3, 500)  # class 3 of 4 never occurs
    probs = rng.dirichlet(np.ones(4), 500)
    probs[np.arange(500), targets] += 0.5
    probs /= probs.sum(1, keepdims=True)
    report = classification_report(Scores("classification", probs, targets, 500))
    assert report.missing == [3]
    assert [c.auc for c in report.curves] == pytest.approx([roc_auc_score(targets == k, probs[:, k]) for k in range(3)])
    assert (report.confusion == confusion_matrix(targets, probs.argmax(1), labels=range(4))).all()
    assert report.micro_auc == pytest.approx(roc_auc_score(np.eye(4)[targets].ravel(), probs.ravel()))


def test_two_classes_draw_one_curve():
    rng = np.random.default_rng(1)
    targets = rng.integers(0, 2, 300)
    p1 = np.clip(0.3 * targets + rng.random(300) * 0.7, 0, 1)
    report = classification_report(Scores("classification", np.stack([1 - p1, p1], 1), targets, 300))
    from gputrain.report.classify import curves_to_draw

    drawn, note = curves_to_draw(report)
    assert [c.label for c in drawn] == [1] and note == "class 1 against class 0"
    assert drawn[0].auc == pytest.approx(roc_auc_score(targets, p1))
