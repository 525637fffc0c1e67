"""The size bound, measured: `python -m tests.unit.report.measure_size [STEPS ...]`.

For each number of logged steps: write a long run directory (long_run.py), time `write_report`,
give the page's size, and the time a headless Chromium takes to parse, run and lay it out.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from gputrain.report.build import write_report
from tests.unit.report.browser import find_browser, probe
from tests.unit.report.long_run import write_long_run


def main(counts: list[int]) -> None:
    browser = find_browser()
    print("steps      metrics.jsonl   report    page     plots  browser: layout  wall")
    with tempfile.TemporaryDirectory() as tmp:
        for steps in counts:
            run_dir = Path(tmp) / f"run-{steps}"
            write_long_run(run_dir, steps)
            started = time.perf_counter()
            written = write_report([run_dir], Path(tmp) / f"r-{steps}.html")
            seconds = time.perf_counter() - started
            shown = "no browser"
            if browser:
                result = probe(written.path, browser)
                assert not result.console, result.console
                shown = f"{result.script_ms / 1000:6.2f} s  {result.wall_s:5.1f} s"
            source = (run_dir / "metrics.jsonl").stat().st_size / 1e6
            print(f"{steps:>9,}  {source:9.1f} MB  {seconds:6.1f} s  {written.size_bytes / 1e6:5.2f} MB  "
                  f"{written.plots:5}  {shown}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1_000, 100_000, 1_000_000])
