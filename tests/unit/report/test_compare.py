"""Several runs in one page: overlaid curves on shared axes, the config keys that differ and only
those, the final metrics side by side; runs of different tasks share what can be shared."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from gputrain.report.build import write_report
from tests.unit.report.conftest import TINY, train_in_process, visible_text


@pytest.fixture(scope="module")
def higher_lr_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The completed run's config with one change: optim.lr."""
    run_dir = tmp_path_factory.mktemp("higher-lr") / "mlp-digits-lr3e-3"
    train_in_process(run_dir, [*TINY, "optim.lr=0.003"])
    return run_dir


def _section(page: str, anchor: str) -> str:
    return page.split(f'<section id="{anchor}">')[1].split("</section>")[0]


def test_two_runs_show_the_one_config_difference_and_overlaid_curves(completed_run, higher_lr_run, tmp_path):
    first = completed_run[0]
    out = tmp_path / "cmp.html"
    written = write_report([first, higher_lr_run], out)
    page = out.read_text()
    differences = _section(page, "config")
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>([^<]+)</td></tr>", differences)
    assert rows == [("optim.lr", "0.001", "0.003")]
    assert "<th>mlp-digits</th><th>mlp-digits-lr3e-3</th>" in differences
    # one loss plot, one curve per run (plus its faint raw curve), on shared axes
    training = _section(page, "training")
    loss = training.split("<figcaption>training loss</figcaption>")[1].split("</figure>")[0]
    names = re.findall(r'class="series" data-name="([^"]+)"', loss)
    assert names == ["mlp-digits (raw)", "mlp-digits", "mlp-digits-lr3e-3 (raw)", "mlp-digits-lr3e-3"]
    assert loss.count("<svg") == 1
    final = visible_text(_section(page, "final"))
    assert "test accuracy" in final and "val loss" in final
    assert _section(page, "final").count('class="num best"') >= 1  # the better run of each metric is marked
    assert "Runs of different tasks" not in page
    assert written.plots > 10


def test_runs_of_different_tasks_say_what_cannot_be_compared_and_show_the_rest(completed_run, regression_run,
                                                                                tmp_path):
    out = tmp_path / "cmp.html"
    write_report([completed_run[0], regression_run], out)
    page = out.read_text()
    text = visible_text(page)
    assert "Runs of different tasks (mlp-digits: classification; run: regression)" in text
    assert "their losses and evaluation metrics measure different things" in text
    titles = [html.unescape(t) for t in re.findall(r"<figcaption>([^<]*)</figcaption>", page)]
    assert "training loss (classification)" in titles and "training loss (regression)" in titles
    assert "learning rate" in titles  # shared: one plot, both runs
    assert "accuracy (classification)" in titles and "mse (regression)" in titles
    assert 'class="num best"' not in _section(page, "final")  # nothing ranked across tasks
    speed = visible_text(_section(page, "speed"))
    assert "mlp-digits" in speed and " run " in f" {speed} "
    assert "ROC, micro-average over classes" in titles and "regression" in visible_text(_section(page, "outcome"))
