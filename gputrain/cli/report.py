"""`gputrain report RUN_DIR [RUN_DIR ...] [-o FILE.html]`: a run, or runs compared, in one HTML
file that opens offline (gputrain/report/)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gputrain.errors import RunError, UsageError
from gputrain.run.fs_errors import said
from gputrain.sweep.layout import is_sweep_dir
from gputrain.terminal import printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (several: compared), or one sweep directory"
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE.html",
        help="where to write the report, - for standard output (default: RUN_DIR/report.html for one run, "
        "compare-<time>.html here for several); never over a file the report did not write",
    )
    parser.epilog = (
        "The file holds every plot, style and script inline: it opens from file:// with no server and no "
        "network. It works on a run in progress (what is there so far), a failed or an interrupted run."
    )


def run(args: argparse.Namespace) -> int:
    from gputrain.pipes import closed_stdout
    from gputrain.report.build import report_output, write_report

    paths = [Path(p) for p in args.run_dirs]
    if len(set(map(_resolved, paths))) < len(paths):
        raise UsageError("a run directory is given twice; give each run once")
    if len(paths) == 1 and is_sweep_dir(paths[0]):  # a sweep's page (report/sweep.py)
        return _sweep(paths[0], args.output)
    output = report_output(paths, args.output)  # before any run is read
    to_stdout = output is None
    started = time.perf_counter()
    try:
        written = write_report(paths, output, stream=sys.stdout if to_stdout else None)
    except OSError as err:
        if to_stdout and closed_stdout(err):
            raise  # `| head`: the entry ends the command quietly (gputrain/pipes.py)
        raise RunError(f"cannot write the report: {err.strerror or err} ({err.filename or output})") from None
    seconds = time.perf_counter() - started
    said = sys.stderr if to_stdout else sys.stdout  # the page itself is standard output's
    for run_ in written.runs:
        for note in run_.notes:
            print(printable(f"note: {run_.name}: {note}"), file=said)
    if to_stdout:
        print(f"wrote the report to standard output ({written.size_bytes / 1e6:.2f} MB)", file=said)
        return 0
    print(
        printable(
            f"wrote {written.path} ({written.size_bytes / 1e6:.2f} MB, {written.plots} plots, {seconds:.1f} s); "
            f"open it in a browser: {written.path.resolve().as_uri()}"
        )
    )
    return 0


def _resolved(path: Path) -> Path:
    """`path` resolved; a loop of links, said as such before the report reads anything."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as err:
        raise UsageError(said(err, path) or f"{path}: {err}") from None


def _sweep(sweep_dir: Path, given: str | None) -> int:
    """A sweep directory's page: SWEEP_DIR/report.html (or -o), never over a file a report did not write."""
    from gputrain.report.build import is_report
    from gputrain.report.sweep import sweep_page
    from gputrain.run.files import write_text
    from gputrain.run.output import Owner, check_output_file
    from gputrain.sweep.layout import REPORT

    output = (
        check_output_file(given, "-o", Owner.of(runs=[sweep_dir]), is_report, stdout=True, example="sweep.html")
        if given is not None
        else sweep_dir / REPORT
    )
    if output is not None and output.exists() and not is_report(output):
        raise UsageError(f"{output}: holds a file gputrain did not write; it is never replaced: give -o another path")
    document = sweep_page(sweep_dir).encode("ascii", "xmlcharrefreplace").decode("ascii")
    if output is None:
        sys.stdout.write(document)
        return 0
    try:
        write_text(output, document)
    except OSError as err:
        raise RunError(f"cannot write the report: {err.strerror or err} ({err.filename or output})") from None
    size = len(document) / 1e6
    print(printable(f"wrote {output} ({size:.2f} MB); open it in a browser: {output.resolve().as_uri()}"))
    return 0
