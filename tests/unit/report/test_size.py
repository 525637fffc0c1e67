"""A long run still makes a small page: every curve is at most ~1,200 points whatever the number of
logged steps, and a one-step spike is still drawn. (1M steps: `python -m tests.unit.report.measure_size`.)"""

from __future__ import annotations

import re

import numpy as np

from gputrain.report.build import write_report
from gputrain.report.series import MAX_BUCKETS
from tests.unit.report.long_run import SPIKE_LOSS, SPIKE_STEP, write_long_run


def test_a_long_run_gives_a_small_page_that_still_shows_a_one_step_spike(tmp_path):
    run_dir = tmp_path / "long"
    write_long_run(run_dir, 100_000)
    out = tmp_path / "r.html"
    written = write_report([run_dir], out)
    page = out.read_text()
    assert written.size_bytes < 600_000
    paths = re.findall(r'<path class="series" data-name="([^"]+)" d="([^"]+)"', page)
    assert paths
    for _, d in paths:
        assert d.count("M") + d.count("L") <= 2 * MAX_BUCKETS + 3
    loss = page.split("<figcaption>training loss</figcaption>")[1].split("</figure>")[0]
    low, high, p0, p1, log = map(float, re.search(r'data-y="([^"]+)"', loss).group(1).split())
    raw = dict(paths)["loss"]
    pixels = np.array(re.findall(r"-?[0-9.]+", raw), dtype=float).reshape(-1, 2)
    t = (pixels[:, 1] - p0) / (p1 - p0)
    values = 10 ** (np.log10(low) + t * (np.log10(high) - np.log10(low))) if log else low + t * (high - low)
    assert abs(values.max() - SPIKE_LOSS) / SPIKE_LOSS < 0.01
    xs = pixels[:, 0]
    x_low, x_high, x0, x1, _ = map(float, re.search(r'data-x="([^"]+)"', loss).group(1).split())
    at = x_low + (xs[values.argmax()] - x0) / (x1 - x0) * (x_high - x_low)
    assert abs(at - SPIKE_STEP) < 100_000 / 1000  # where it happened, to a pixel's worth of steps
