"""Read a run directory as it stands: complete, still running, failed or interrupted.

Every file is optional (a run in progress has no summary.json yet, a failed one may have no test
scores, a profile or an LR sweep adds its own file), and none is trusted to be whole: a line of
metrics.jsonl torn by a kill is counted and skipped, an unreadable file becomes a note on the page.
What a report needs and cannot find is a `DataError` naming the directory and the missing file.
"""

from __future__ import annotations

import datetime
import json
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gputrain.errors import DataError
from gputrain.evaluate.scores import Scores, load_scores
from gputrain.run.layout import (
    CONFIG,
    ENV,
    ERROR_LOG,
    LR_FIND,
    METRICS,
    REPORTED_FILES,
    SUMMARY,
    profile_name,
    scores_name,
)
from gputrain.run.prior import COMPLETE

ERROR_LOG_LINES = 40
_TASK_OF_METRIC = {
    "accuracy": "classification",
    "precision": "classification",
    "recall": "classification",
    "f1": "classification",
    "auroc": "classification",
    "mse": "regression",
    "mae": "regression",
    "perplexity": "lm",
}


_TASK_OF_DATA = {
    "digits": "classification",
    "mnist": "classification",
    "image_folder": "classification",
    "text": "lm",
    "tokens": "lm",
}
"""The task of the data sources that have only one (csv and synthetic can be either)."""


class Columns:
    """metrics.jsonl's step rows as one float array per field (NaN where a row lacks it), built
    row by row: a million rows take ~8 MB per field, not a million dicts."""

    def __init__(self) -> None:
        self.count = 0
        self._data: dict[str, array[float]] = {}

    def add(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            column = self._data.get(key)
            if column is None:  # a field that first appears now (the time split, after its first sample)
                column = self._data[key] = array("d", [math.nan]) * self.count
            column.append(float(value))
        self.count += 1
        for column in self._data.values():
            if len(column) < self.count:
                column.append(math.nan)

    def get(self, key: str) -> np.ndarray | None:
        """The field's values, or None when no row has a number for it."""
        column = self._data.get(key)
        if column is None:
            return None
        values = np.frombuffer(column, dtype=float).copy()
        return values if np.isfinite(values).any() else None

    def last(self, key: str) -> float | None:
        """The field's latest finite value (a run in progress: its figures so far)."""
        values = self.get(key)
        if values is None:
            return None
        finite = values[np.isfinite(values)]
        return float(finite[-1]) if finite.size else None

    def keys(self) -> list[str]:
        return list(self._data)


@dataclass(slots=True)
class Run:
    """One run directory, read."""

    path: Path
    name: str
    config_text: str | None = None
    config: dict[str, dict[str, Any]] | None = None
    """The resolved config as nested dicts (sections → keys), as the run wrote it."""
    summary: dict[str, Any] | None = None
    steps: Columns = field(default_factory=Columns)
    evals: dict[str, dict[str, tuple[list[float], list[float]]]] = field(default_factory=dict)
    """split → metric → (steps, values)."""
    env: dict[str, Any] | None = None
    scores: Scores | None = None
    """The test split's saved scores (scores-test.npz)."""
    profile: dict[str, Any] | None = None
    lr_find: dict[str, Any] | None = None
    error_log: str | None = None
    """The last ERROR_LOG_LINES lines of error.log."""
    notes: list[str] = field(default_factory=list)
    """What could not be read, for the page."""
    metrics_written: float | None = None
    """When metrics.jsonl last changed (seconds since the epoch)."""

    @property
    def last_step(self) -> int | None:
        step = self.steps.get("step")
        evals = [s for metrics in self.evals.values() for steps, _ in metrics.values() for s in steps]
        candidates = ([float(np.nanmax(step))] if step is not None else []) + evals
        return int(max(candidates)) if candidates else None

    @property
    def sweep_only(self) -> bool:
        """A `gputrain lr-find` directory of its own: its LR sweep and nothing of a training run."""
        return self.lr_find is not None and self.summary is None and self.steps.count == 0 and not self.evals

    @property
    def status(self) -> str:
        """completed, stopped_early, failed, interrupted, running (no summary yet, or a summary
        older than the rows: the run was resumed and goes on), or lr-find (sweep_only)."""
        if self.sweep_only:
            return "lr-find"
        if self.summary is None:
            return "running"
        last = self.last_step
        step = self.summary.get("global_step")  # text in a hand-edited file counts as no step, as null does
        if last is not None and last > (step if isinstance(step, (int, float)) and not isinstance(step, bool) else 0):
            return "running"
        return str(self.summary.get("status", "unknown"))

    @property
    def complete(self) -> bool:
        return self.status in COMPLETE

    @property
    def is_rl(self) -> bool:
        """A `gputrain rl` run: its summary has an rl section, or (still going) its rows count
        environment steps. Its config has data and model sections too, at their defaults."""
        return isinstance((self.summary or {}).get("rl"), dict) or self.steps.get("env_steps") is not None

    @property
    def task(self) -> str | None:
        """classification, regression, lm, custom, rl, or None where nothing says."""
        if self.is_rl:
            return "rl"
        configured = (self.config or {}).get("data", {}).get("task")
        if configured and configured != "auto":
            return str(configured)
        for metrics in self.evals.values():
            for metric in metrics:
                if metric in _TASK_OF_METRIC:
                    return _TASK_OF_METRIC[metric]
        if self.scores is not None:
            return self.scores.task
        if (self.config or {}).get("model", {}).get("name") == "gpt":
            return "lm"
        return _TASK_OF_DATA.get(str((self.config or {}).get("data", {}).get("name")))

    def resolved(self, key: str) -> Any:
        """device, precision, world_size or layout as the run resolved them (None where unknown):
        summary.json's once the run has ended, else env.json's "run", which the run writes at its
        start (a run still going has no summary, or one of an earlier attempt)."""
        started = (self.env or {}).get("run")
        started = started if isinstance(started, dict) else {}
        summary = self.summary or {}
        first, second = (started, summary) if self.status == "running" else (summary, started)
        value = first.get(key)
        return value if value is not None else second.get(key)  # null: a run that failed while building

    def describe_running(self) -> str:
        """What a missing or stale summary means, with the time metrics.jsonl last changed."""
        when = ""
        if self.metrics_written is not None:
            stamp = datetime.datetime.fromtimestamp(self.metrics_written).strftime("%Y-%m-%d %H:%M:%S")
            when = f"; metrics.jsonl last written {stamp}"
        if self.summary is not None:
            return (
                f"resumed after an earlier attempt ({self.summary.get('status')} at step "
                f"{self.summary.get('global_step')}) and not finished yet{when}"
            )
        return f"no summary.json yet: the run is still going, or was killed before it could write one{when}"


def _read_json(path: Path, run: Run) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        run.notes.append(f"{path.name} could not be read ({type(err).__name__}); left out")
        return None


def _read_metrics(path: Path, run: Run) -> None:
    """Step rows into `run.steps`, evaluation rows into `run.evals`; damaged lines are counted."""
    damaged = 0
    with path.open("rb") as lines:
        for raw in lines:
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (UnicodeDecodeError, ValueError, RecursionError):
                damaged += 1
                continue
            step = row.get("step") if isinstance(row, dict) else None
            if isinstance(step, bool) or not isinstance(step, (int, float)):
                damaged += 1
                continue
            split = row.get("split")
            if split is None:
                run.steps.add(row)
                continue
            metrics = run.evals.setdefault(str(split), {})
            for key, value in row.items():
                if key not in ("step", "epoch", "split") and isinstance(value, (int, float)):
                    steps, values = metrics.setdefault(key, ([], []))
                    steps.append(float(step))
                    values.append(float(value))
    if damaged:
        run.notes.append(f"metrics.jsonl: {damaged} damaged line(s) skipped (a write cut short by a kill)")


def _read_config(path: Path, run: Run) -> None:
    """The resolved config, read as TOML only: a config of an older gputrain (a key since renamed)
    still shows as it was written."""
    from gputrain.config.load import read_toml
    from gputrain.errors import UsageError

    if not path.is_file():
        return
    try:
        run.config_text = path.read_text(encoding="utf-8")
        run.config = read_toml(path)
    except (OSError, UnicodeDecodeError, UsageError) as err:
        run.notes.append(f"config.toml could not be read ({err}); left out")


def read_run(path: Path, name: str | None = None) -> Run:
    """Everything a report shows of the run in `path`.

    Raises:
        DataError: `path` is not a directory, holds none of REPORTED_FILES (it names them), or is a run
            that has logged nothing yet.
    """
    if not path.exists():
        raise DataError(f"{path}: no such directory")
    if not path.is_dir():
        raise DataError(f"{path}: not a directory; give a run directory (runs/<name>/)")
    present = [f for f in REPORTED_FILES if (path / f).is_file()]
    if not present:
        raise DataError(
            f"{path}: not a run directory: it has no {', '.join(REPORTED_FILES[:-1])} or {REPORTED_FILES[-1]} "
            "(gputrain train writes them into its --run-dir)"
        )
    run = Run(path=path, name=name or path.name)
    _read_config(path / CONFIG, run)
    summary = _read_json(path / SUMMARY, run)
    run.summary = summary if isinstance(summary, dict) else None
    metrics = path / METRICS
    if metrics.is_file():
        run.metrics_written = metrics.stat().st_mtime
        _read_metrics(metrics, run)
    if run.steps.count == 0 and not run.evals and run.summary is None and LR_FIND not in present:
        state = "is empty" if metrics.is_file() else "does not exist yet"
        every = (run.config or {}).get("log", {}).get("every_steps", 10)
        raise DataError(
            f"{path}: no metrics yet: metrics.jsonl {state}; the run logs its first row after "
            f"log.every_steps={every} steps, so run gputrain report again then"
        )
    env = _read_json(path / ENV, run)
    run.env = env if isinstance(env, dict) else None
    profile = _read_json(path / profile_name(None), run)
    run.profile = profile if isinstance(profile, dict) else None
    lr_find = _read_json(path / LR_FIND, run)
    run.lr_find = lr_find if isinstance(lr_find, dict) else None
    if run.config is None and run.lr_find is not None and isinstance(run.lr_find.get("config"), dict):
        run.config = run.lr_find["config"]  # a sweep's own directory: the config the sweep ran
    scores = path / scores_name("test")
    if scores.is_file():
        try:
            run.scores = load_scores(scores)
        except (OSError, ValueError, KeyError) as err:
            run.notes.append(f"{scores.name} could not be read ({type(err).__name__}); the test curves are left out")
    error_log = path / ERROR_LOG
    if error_log.is_file():
        with_errors = error_log.read_text(encoding="utf-8", errors="replace").splitlines()
        run.error_log = "\n".join(with_errors[-ERROR_LOG_LINES:])
    return run


def read_runs(paths: list[Path]) -> list[Run]:
    """Several runs, each named by its directory, or by its parent too where two names collide."""
    names = [p.name for p in paths]
    runs = []
    for path in paths:
        clash = names.count(path.name) > 1
        runs.append(read_run(path, f"{path.parent.name}/{path.name}" if clash else path.name))
    return runs
