"""`write_report`: one run's page or several runs compared, written as one HTML file.

The pieces: rundir.py reads the run directories; curves.py, outcome.py and speed.py draw; overview.py
writes the facts; page.py puts them into one self-contained document.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gputrain import __version__
from gputrain.report.curves import eval_figures, loss_figure, lr_find_figure, training_figures
from gputrain.report.escape import esc
from gputrain.report.outcome import compare_outcomes_html, outcome_html
from gputrain.report.overview import (
    config_differences_html,
    config_html,
    final_metrics_html,
    header_html,
    machine_html,
    runs_table_html,
)
from gputrain.report.page import GENERATOR, Section, page, plots, shown
from gputrain.report.rundir import Run, read_runs
from gputrain.report.speed import compare_speed_html, profile_html, speed_html
from gputrain.report.tune import tune_html
from gputrain.run.files import write_text
from gputrain.run.layout import REPORT, TENSORBOARD
from gputrain.run.output import Owner, check_output_file, head


@dataclass(frozen=True, slots=True)
class Written:
    path: Path
    size_bytes: int
    plots: int
    runs: list[Run]


def single_run_page(run: Run) -> str:
    lr_find = lr_find_figure(run)
    lr_text = ""
    if run.lr_find and lr_find is not None:
        record = run.lr_find
        lr = record.get("suggested_lr")
        rules = record.get("other_rules")
        lr_text = (
            f"<p>Suggested <code>optim.lr={esc(shown(lr, '.2e'))}</code> (rule: {esc(record.get('rule_text'))}); "
            + "; ".join(
                f"{esc(k)} rule: {esc(shown(v, '.2e'))}" for k, v in (rules if isinstance(rules, dict) else {}).items()
            )
            + f". {esc(record.get('steps_run'))} of {esc(record.get('steps'))} steps, {esc(record.get('stopped'))}; "
            f"batch {esc(record.get('batch_size'))}, {esc(record.get('precision'))}, "
            f"{esc(record.get('world_size'))} rank(s).</p>"
            if lr
            else "<p>The sweep gave no suggestion (it diverged too early): lower --start-lr.</p>"
        )
    sections = [
        Section("training", "Training", plots(training_figures([run]), "step")),
        Section("evaluation", "Evaluation", plots(eval_figures([run]), "step")),
        Section("outcome", "Test split", outcome_html(run)),
        Section("speed", "Speed", speed_html(run) if run.steps.count or run.summary else ""),
        Section("profile", "Profile findings", profile_html(run)),
        Section("lr-find", "LR finder", lr_text + plots([lr_find], "lr") if lr_find else ""),
        Section("tune", "Tune", tune_html(run)),
        Section("machine", "Machine", machine_html(run)),
        Section("config", "Config", config_html(run)),
    ]
    return page(f"gputrain report: {run.name}", header_html(run), sections, _footer([run]))


def comparison_page(runs: Sequence[Run]) -> str:
    """Runs on shared axes. Runs of different tasks share what they can (speed, learning rate,
    config); their losses and metrics are drawn per task, and the page says so."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.task or "unknown task", []).append(run)
    top = f"<h1>{len(runs)} runs compared</h1>" + runs_table_html(runs)
    if len(groups) > 1:
        described = "; ".join(f"{', '.join(r.name for r in group)}: {task}" for task, group in groups.items())
        top += (
            f'<div class="alert warn">Runs of different tasks ({esc(described)}): their losses and evaluation '
            "metrics measure different things, so those are drawn per task and not ranked against each other; "
            "speed, learning rate, gradient norm and config are compared across all.</div>"
        )
    training = [f for f in training_figures(runs) if not f.title.startswith("training loss")]
    losses = [
        loss_figure(group, f"training loss ({task})" if len(groups) > 1 else "training loss", label_runs=True)
        for task, group in groups.items()
    ]
    evaluation = []
    for task, group in groups.items():
        for figure in eval_figures(group, label_runs=True):
            if len(groups) > 1:
                figure.title = f"{figure.title} ({task})"
            evaluation.append(figure)
    sections = [
        Section("config", "Config differences", config_differences_html(runs)),
        Section("final", "Final metrics", final_metrics_html(runs)),
        Section("training", "Training", plots([f for f in losses if f is not None] + training, "step")),
        Section("evaluation", "Evaluation", plots(evaluation, "step")),
        Section("outcome", "Test split", compare_outcomes_html(runs)),
        Section("speed", "Speed", compare_speed_html(runs)),
    ]
    return page(f"gputrain report: {len(runs)} runs", top, sections, _footer(runs))


def _footer(runs: Sequence[Run]) -> str:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    logdirs = " ".join(str(r.path / TENSORBOARD) for r in runs if (r.path / TENSORBOARD).is_dir())
    tensorboard = f" Live curves during a run: <code>tensorboard --logdir {esc(logdirs)}</code>." if logdirs else ""
    return (
        f"Written by gputrain {esc(__version__)} report at {stamp} from the run directories' own files; "
        f"one self-contained file: no server, no network.{tensorboard}"
    )


def default_output(paths: Sequence[Path]) -> Path:
    """One run: report.html in its directory. Several: compare-<time>.html here."""
    if len(paths) == 1:
        return paths[0] / REPORT
    return Path(f"compare-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.html")


def is_report(path: Path) -> bool:
    """Whether the file at `path` is a page `gputrain report` wrote (its generator tag; before the tag,
    its title): the only file a report replaces (run/output.py)."""
    start = head(path, 1024)
    return GENERATOR.encode() in start or b"<title>gputrain report" in start


def report_output(paths: Sequence[Path], given: str | None) -> Path | None:
    """Where the report of `paths` goes, checked before any run is read (run/output.py): -o (`-`:
    standard output), or `default_output`; a run's directory takes report.html only.

    Raises:
        UsageError: naming -o, the path and what would be right.
    """
    owner = Owner.of(runs=paths, designated=[REPORT])
    if given is None:
        if not all(os.path.isdir(p) for p in paths):
            return default_output(paths)  # no run there: reading it says so (rundir.py), nothing is written
        return check_output_file(default_output(paths), "-o (default)", owner, is_report, example=REPORT)
    return check_output_file(given, "-o", owner, is_report, stdout=True, example=REPORT)


def write_report(paths: Sequence[Path], output: Path | None = None, stream: TextIO | None = None) -> Written:
    """Read the run directories in `paths`, draw them, and write the page to `output` (or to `stream`).

    Raises:
        DataError: a path is not a run directory, or a run has logged nothing yet (rundir.read_run).
        OSError: the output cannot be written.
    """
    runs = read_runs(list(paths))
    document = single_run_page(runs[0]) if len(runs) == 1 else comparison_page(runs)
    # ASCII with character references: the file reads the same whatever encoding writes or opens it
    document = document.encode("ascii", "xmlcharrefreplace").decode("ascii")
    charts = document.count('class="chart"')
    if stream is not None:
        stream.write(document)
        stream.flush()
        return Written(Path("-"), len(document), charts, runs)
    out = output or default_output(paths)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, document)  # atomic: a browser reloading the page never sees half of it
    return Written(out, len(document), charts, runs)
