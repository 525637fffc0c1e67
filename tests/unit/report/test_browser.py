"""The report in a real headless browser, offline: no console message, every plot drew marks of
real extent, the pointer shows values, a heading click sorts. Skipped, naming why, where no
Chromium is installed (.ci/run installs it; `apt-get install chromium` here)."""

from __future__ import annotations

import pytest

from gputrain.report.build import write_report
from tests.unit.report.browser import NAMES, find_browser, probe, run_script

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason=f"no headless browser ({', '.join(NAMES)} not on PATH): apt-get install chromium"
)


def _check_drawn(result, plots: int) -> None:
    assert result.console == [], result.console
    assert len(result.charts) == plots
    for chart in result.charts:
        assert chart["drawn"] >= 1, chart
        width, height = chart["extent"]
        # a curve, a bar or a matrix spans a real part of its plot (a flat line: its width)
        assert max(width, height) > 40, chart
        assert chart["screen"][0] > 200, chart  # laid out at a readable size


def test_one_run_draws_every_plot_offline(completed_run, tmp_path):
    out = tmp_path / "report.html"
    written = write_report([completed_run[0]], out)
    assert BROWSER is not None
    result = probe(out, BROWSER)
    _check_drawn(result, written.plots)
    kinds = {c["kind"] for c in result.charts}
    assert {"line", "heatmap", "bars"} <= kinds
    assert result.hover is not None and result.hover.startswith("step ")  # values under the pointer
    assert result.sorted == sorted(result.sorted, reverse=True)  # a click sorted the column
    assert result.script_ms < 5000


def test_compared_runs_draw_every_plot_offline(completed_run, regression_run, tmp_path):
    out = tmp_path / "cmp.html"
    written = write_report([completed_run[0], regression_run], out)
    assert BROWSER is not None
    _check_drawn(probe(out, BROWSER), written.plots)


def test_a_script_error_would_be_caught(completed_run, tmp_path):
    """The console check is real: a page whose script throws is reported (the edited script no
    longer has the hash the page's policy names: opened without the policy)."""
    out = tmp_path / "report.html"
    write_report([completed_run[0]], out)
    out.write_text(out.read_text().replace('"use strict";', '"use strict"; undefinedFunction();', 1))
    assert BROWSER is not None
    result = probe(out, BROWSER, policy=False)
    assert any("undefinedFunction" in line for line in result.console)
    assert result.hover is None  # and nothing the script does happened


def test_the_policy_runs_the_pages_script_and_nothing_else(completed_run, tmp_path):
    """The Content-Security-Policy is the second wall: a handler put into the page (as an unescaped
    value would) does not run under it, and the refusal is a console message; without the policy
    the same page runs it, so the check can fail."""
    out = tmp_path / "report.html"
    write_report([completed_run[0]], out)
    out.write_text(out.read_text().replace("<main>", '<main><img src="x" onerror="document.title=1337">', 1))
    assert BROWSER is not None
    guarded = probe(out, BROWSER)
    assert guarded.hover is not None  # the page's own script ran under the policy
    assert any("Content Security Policy" in line for line in guarded.console), guarded.console
    # read once the page has loaded: an image's error event comes before the load event
    title = '<script>addEventListener("load", function () { document.body.insertAdjacentHTML("beforeend", \
        "<pre id=t>" + JSON.stringify(document.title) + "</pre>"); });</script>'
    assert run_script(out, BROWSER, title, "t")[0] != "1337"
    assert run_script(out, BROWSER, title, "t", policy=False)[0] == "1337"
