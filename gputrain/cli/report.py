"""`gputrain report RUN_DIR [RUN_DIR ...] [-o FILE.html]`: a run, or runs compared, in one HTML
file that opens offline (gputrain/report/)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gputrain.errors import RunError, UsageError
from gputrain.run.layout import REPORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (several: compared)")
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE.html",
        help="where to write the report (default: RUN_DIR/report.html for one run, compare-<time>.html here "
        "for several)",
    )
    parser.epilog = (
        "The file holds every plot, style and script inline: it opens from file:// with no server and no "
        "network. It works on a run in progress (what is there so far), a failed or an interrupted run."
    )


def run(args: argparse.Namespace) -> int:
    from gputrain.report.build import write_report

    paths = [Path(p) for p in args.run_dirs]
    if len(set(map(Path.resolve, paths))) < len(paths):
        raise UsageError("a run directory is given twice; give each run once")
    output = Path(args.output) if args.output else None
    if output is not None and output.is_dir():
        raise UsageError(f"-o {output}: is a directory; give a file name such as {output / REPORT}")
    started = time.perf_counter()
    try:
        written = write_report(paths, output)
    except OSError as err:
        raise RunError(f"cannot write the report: {err.strerror or err} ({err.filename or output})") from None
    seconds = time.perf_counter() - started
    for run_ in written.runs:
        for note in run_.notes:
            print(f"note: {run_.name}: {note}")
    print(
        f"wrote {written.path} ({written.size_bytes / 1e6:.2f} MB, {written.plots} plots, {seconds:.1f} s); "
        f"open it in a browser: {written.path.resolve().as_uri()}"
    )
    return 0
