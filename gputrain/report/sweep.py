"""`gputrain report SWEEP_DIR`: a sweep's page: its trials in a table, the objective against each
searched parameter, and the best trials' validation curves overlaid.

The trials come from the study (its storage, named in sweep.json, or GPUTRAIN_SWEEP_STORAGE where
the URL needs a password sweep.json leaves out); each trial's curve from its own run directory.
Drawn with svg.py and page.py, every text escaped by them, as every other report page is.
"""

from __future__ import annotations

import datetime
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gputrain import __version__
from gputrain.errors import DataError, UsageError, first_line
from gputrain.report.escape import esc
from gputrain.report.page import Cell, Section, facts, num, page, plots, table
from gputrain.report.svg import Figure, Line, color, line_chart, scatter

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

BEST_CURVES = 5
"""Complete trials whose validation curves are overlaid (the best ones)."""


def _record(sweep_dir: Path) -> dict[str, Any]:
    from gputrain.run.reader import parse_json, read_text
    from gputrain.sweep.layout import SWEEP_RECORD

    text = read_text(sweep_dir, SWEEP_RECORD)
    record = parse_json(text or "", str(sweep_dir / SWEEP_RECORD))
    if not isinstance(record, dict) or not isinstance(record.get("study"), str):
        raise DataError(f"{sweep_dir / SWEEP_RECORD}: not a sweep's record (no study named)")
    return record


def _trials(sweep_dir: Path, record: dict[str, Any]) -> tuple[list[FrozenTrial], str]:
    """The sweep's trials (less the study's bookkeeping) and the direction."""
    try:
        import optuna
    except ImportError:
        raise UsageError("a sweep's report reads its study: pip install 'gputrain[optuna]'") from None
    from gputrain.sweep.pruning import STORAGE_ENV
    from gputrain.sweep.study import counted, open_storage

    url = os.environ.get(STORAGE_ENV) or str(record.get("storage"))
    storage = open_storage(url)
    try:
        study = optuna.load_study(study_name=record["study"], storage=storage)
    except KeyError:
        raise DataError(f"{sweep_dir}: the storage holds no study {record['study']!r}") from None
    except Exception as err:  # noqa: BLE001 - the storage's own error, in one line
        raise DataError(f"{sweep_dir}: the study cannot be read: {first_line(err)}") from None
    return counted(study.get_trials(deepcopy=False)), study.direction.name.lower()


def _steps(trial: FrozenTrial) -> int | None:
    from gputrain.run.layout import SUMMARY
    from gputrain.run.reader import parse_json, read_text
    from gputrain.sweep.study import RUN_DIR

    run_dir = trial.user_attrs.get(RUN_DIR)
    if not isinstance(run_dir, str):
        return None
    try:
        summary = parse_json(read_text(Path(run_dir), SUMMARY) or "null", SUMMARY)
    except Exception:  # noqa: BLE001 - a trial still starting, or a removed run: no figure
        return None
    steps = summary.get("global_step") if isinstance(summary, dict) else None
    return steps if isinstance(steps, int) else None


def _table(trials: list[FrozenTrial], keys: list[str], best: int | None) -> str:
    from gputrain.sweep.study import RUN_DIR

    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        # a pruned trial's value is only its last report: the objective is a complete trial's
        value = num(t.value) if t.value is not None and t.state.name == "COMPLETE" else Cell("–")
        if t.number == best:
            value = Cell(value.text, value.value, best=True)
        params = [_param_cell(t.params.get(k)) for k in keys]
        run_dir = t.user_attrs.get(RUN_DIR)
        name = Path(run_dir).name if isinstance(run_dir, str) else "–"
        rows.append([Cell(str(t.number), t.number), t.state.name.lower(), value, *params, num(_steps(t), 0), name])
    return table(["trial", "state", "objective", *keys, "steps", "run"], rows)


def _param_cell(value: Any) -> Cell | str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return Cell(str(value), value)
    return num(value) if isinstance(value, float) else str(value)


def _axis(values: list[Any], kind: str) -> tuple[np.ndarray, str, str]:
    """A parameter's values on an axis: log10 for a log range, an index for choices of text."""
    if kind == "log_uniform":
        return np.log10(np.asarray(values, dtype=float)), "log10", ""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=float), "", ""
    order = sorted({str(v) for v in values})
    return (
        np.asarray([order.index(str(v)) for v in values], dtype=float),
        "index",
        ", ".join(f"{i}: {v}" for i, v in enumerate(order)),
    )


def _objective_figures(trials: list[FrozenTrial], params: list[dict[str, Any]], metric: str) -> list[Figure]:
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None and math.isfinite(t.value)]
    figures = []
    for p in params:
        key = p.get("key")
        have = [t for t in complete if key in t.params]
        if not have or not isinstance(key, str):
            continue
        xs, how, legend = _axis([t.params[key] for t in have], str(p.get("kind")))
        label = f"{how}({key})" if how == "log10" else key + (" (choice index)" if how else "")
        ys = np.asarray([t.value for t in have], dtype=float)
        note = f"{len(have)} complete trials" + (f"; {legend}" if legend else "")
        figures.append(scatter(f"{metric} against {key}", xs, ys, x_label=label, y_label=metric, note=note))
    return figures


def _curves(trials: list[FrozenTrial], metric: str, direction: str) -> Figure | None:
    from gputrain.sweep.study import RUN_DIR
    from gputrain.sweep.trial import val_values

    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    sign = 1.0 if direction == "minimize" else -1.0
    lines = []
    for i, t in enumerate(sorted(complete, key=lambda t: (sign * float(t.value or 0.0), t.number))[:BEST_CURVES]):
        run_dir = t.user_attrs.get(RUN_DIR)
        points = val_values(Path(run_dir), metric) if isinstance(run_dir, str) else []
        if points:
            steps, values = zip(*points, strict=True)
            lines.append(
                Line(f"trial {t.number}", np.asarray(steps, float), np.asarray(values, float), color(i), markers=True)
            )
    if not lines:
        return None
    return line_chart(f"validation {metric}: the best trials", lines, x_label="step", y_label=metric)


def sweep_page(sweep_dir: Path) -> str:
    """The sweep directory's page, as one self-contained HTML document."""
    record = _record(sweep_dir)
    settings = record.get("settings") if isinstance(record.get("settings"), dict) else {}
    assert isinstance(settings, dict)
    metric = str(settings.get("metric", "loss"))
    space = settings.get("space") if isinstance(settings.get("space"), dict) else {}
    params = [p for p in (space or {}).get("params", []) if isinstance(p, dict)]
    trials, direction = _trials(sweep_dir, record)
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    sign = 1.0 if direction == "minimize" else -1.0
    best = min(complete, key=lambda t: (sign * float(t.value or 0.0), t.number)) if complete else None
    states = {s: sum(t.state.name.lower() == s for t in trials) for s in ("complete", "pruned", "fail", "running")}
    top = f"<h1>sweep {esc(record['study'])}</h1>" + facts(
        [
            ("trials", str(len(trials))),
            ("complete / pruned / failed", f"{states['complete']} / {states['pruned']} / {states['fail']}"),
            ("running", str(states["running"])),
            ("objective", f"{direction} {metric} ({settings.get('objective', 'final')})"),
            ("best", f"trial {best.number}: {best.value:.6g}" if best else "none yet"),
        ]
    )
    keys = [str(p.get("key")) for p in params]
    curves = _curves(trials, metric, direction)
    sections = [
        Section("trials", "Trials", _table(trials, keys, best.number if best else None)),
        Section("objective", "Objective against each parameter", plots(_objective_figures(trials, params, metric))),
        Section("curves", "Best trials' curves", plots([curves], "step") if curves else ""),
    ]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    footer = (
        f"Written by gputrain {esc(__version__)} report at {stamp} from the study ({esc(record.get('storage'))}) "
        "and the trials' run directories; one self-contained file: no server, no network."
    )
    return page(f"gputrain report: sweep {record['study']}", top, sections, footer)
