"""Read a run directory as it stands: complete, still running, failed or interrupted.

Every file is optional (a run in progress has no summary.json yet, a failed one may have no test
scores, a profile or an LR sweep adds its own file), and none is trusted to be whole: a line of
metrics.jsonl torn by a kill is counted and skipped, an unreadable file becomes a note on the page.
Each file is read by run/reader.py's rules (no link out of the directory, the right kind, a bounded
size, JSON and TOML parsed without trust, fields checked by run/shapes.py): a file or a field that
breaks them is left out with a note naming it, so what the drawing modules get has the kinds they
expect. What a report needs and cannot find is a `DataError` naming the directory and the missing file.
"""

from __future__ import annotations

import datetime
import io
import math
import os
import zipfile
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gputrain.errors import DataError
from gputrain.evaluate.scores import KEEPS_SCORES, Scores, load_scores
from gputrain.run import shapes
from gputrain.run.layout import (
    CONFIG,
    ENV,
    ERROR_LOG,
    LR_FIND,
    METRICS,
    REPORTED_FILES,
    SUMMARY,
    TUNE,
    profile_name,
    scores_name,
)
from gputrain.run.prior import COMPLETE
from gputrain.run.reader import (
    FINITE,
    INT_BOUND,
    RunFileError,
    Shape,
    is_number,
    iter_lines,
    parse_json,
    read_bytes,
    read_json,
    read_tail,
    read_text,
    run_entry,
)

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


TASK_OF_DATA = {
    "digits": "classification",
    "mnist": "classification",
    "image_folder": "classification",
    "text": "lm",
    "tokens": "lm",
}
"""The task of the data sources that have only one (csv and synthetic can be either)."""


MAX_FIELDS = 128
"""Fields of metrics.jsonl's rows kept (a run logs a few dozen): rows of made-up keys would
otherwise make a column as long as the file for each key."""


class Columns:
    """metrics.jsonl's step rows as one float array per field (NaN where a row lacks it), built
    row by row: a million rows take ~8 MB per field, not a million dicts."""

    def __init__(self) -> None:
        self.count = 0
        self._data: dict[str, array[float]] = {}

    def add(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            if not is_number(value):  # an int too large for a float included
                continue
            column = self._data.get(key)
            if column is None and len(self._data) >= MAX_FIELDS:
                continue
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
    tune: dict[str, Any] | None = None
    """tune.json: `gputrain tune`'s rows and winner (report/tune.py draws them)."""
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
        if self.tune is not None and self.summary is None and self.steps.count == 0 and not self.evals:
            return "tune"
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
        return TASK_OF_DATA.get(str((self.config or {}).get("data", {}).get("name")))

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


def _left_out(run: Run, err: Exception, what: str = "left out") -> None:
    """The reader's line as a note, the file named within the run (the page names the run)."""
    run.notes.append(f"{_within(run, str(err))}; {what}")


def _within(run: Run, text: str) -> str:
    return text.replace(f"{run.path}{os.sep}", "")


def _read_json(run: Run, name: str, shape: Shape) -> dict[str, Any] | None:
    """The run file `name` checked by `shape` (run/shapes.py); what it holds wrongly is a note."""
    said: list[str] = []
    try:
        return read_json(run.path, name, shape, said)
    except RunFileError as err:
        _left_out(run, err)
        return None
    finally:
        run.notes.extend(_within(run, line) for line in said)


def _read_metrics(run: Run) -> None:
    """Step rows into `run.steps`, evaluation rows into `run.evals`; damaged lines are counted."""
    damaged = 0
    for raw in iter_lines(run.path, METRICS):
        if raw is not None and not raw.strip():
            continue
        try:
            row = parse_json(raw, METRICS) if raw is not None else None
        except RunFileError:
            row = None
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(row, dict) or not FINITE(step):
            damaged += 1
            continue
        at = float(row["step"])
        numbers = {k: v for k, v in row.items() if is_number(v)}  # a value too large for a float: not one
        split = row.get("split")
        if split is None:
            run.steps.add(numbers)
            continue
        metrics = run.evals.setdefault(str(split)[:100], {})
        for key, value in numbers.items():
            if key not in ("step", "epoch") and (key in metrics or len(metrics) < MAX_FIELDS):
                steps, values = metrics.setdefault(key, ([], []))
                steps.append(at)
                values.append(float(value))
    if damaged:
        run.notes.append(
            f"metrics.jsonl: {damaged} damaged line(s) skipped (a write cut short by a kill, or a line that "
            "is not a JSON object with a numeric step)"
        )


def _read_config(run: Run) -> None:
    """The resolved config, read as TOML only: a config of an older gputrain (a key since renamed)
    still shows as it was written. Its sections are tables; anything else in it is left out."""
    from gputrain.config.load import parse_toml
    from gputrain.errors import UsageError

    try:
        text = read_text(run.path, CONFIG)
        if text is None:
            return
        parsed = parse_toml(text, CONFIG)
    except (RunFileError, UsageError) as err:
        _left_out(run, err)
        return
    run.config_text = text
    run.config = _tables(parsed, CONFIG, run)


def _tables(config: dict[str, Any], where: str, run: Run) -> dict[str, dict[str, Any]]:
    """`config`'s sections that are tables (`[train]`); another value is a note."""
    kept = {section: values for section, values in config.items() if isinstance(values, dict)}
    others = [section[:40] for section in config if section not in kept]
    if others:
        them = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        run.notes.append(f"{where}: {them} not a table of keys ([section] key = value); left out")
    return kept


def _read_scores(run: Run) -> None:
    """scores-test.npz: plain arrays only, of the shapes one task's scores have (evaluate/scores.py)."""
    name = scores_name("test")
    try:
        data = read_bytes(run.path, name)
        if data is None:
            return
        _check_unpacked_size(data, name)
        run.scores = check_scores(load_scores(io.BytesIO(data)), name)
    except RunFileError as err:
        _left_out(run, err, "the test curves are left out")
    except (OSError, ValueError, TypeError, KeyError, EOFError, zipfile.BadZipFile) as err:
        run.notes.append(f"{name} could not be read ({type(err).__name__}); the test curves are left out")


UNPACKED_SCORES = 2 << 30
"""The most scores-test.npz may unpack to (20,000 rows of 10,000 classes is 800 MB): a small file
that unpacks to far more is not one a run wrote."""


def _check_unpacked_size(data: bytes, where: str) -> None:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        unpacked = sum(member.file_size for member in archive.infolist())
    if unpacked > UNPACKED_SCORES:
        raise RunFileError(f"{where}: unpacks to {unpacked >> 20} MB, over the {UNPACKED_SCORES >> 20} MB scores hold")


def check_scores(scores: Scores, where: str) -> Scores:
    """`scores` where its arrays agree with its task and each other.

    Raises:
        RunFileError: naming the file and what does not agree.
    """
    probs, targets = scores.scores, scores.targets
    if scores.task not in KEEPS_SCORES:
        raise RunFileError(f"{where}: task {scores.task[:40]!r}; {' or '.join(KEEPS_SCORES)} is right")
    for key, array_ in (("scores", probs), ("targets", targets)):
        if array_.dtype.kind not in "biuf":
            raise RunFileError(f"{where}: {key} are of dtype {array_.dtype}; numbers are right")
    rows = len(probs) if probs.ndim else -1
    if probs.ndim != 2 or rows == 0 or probs.shape[1] == 0:
        raise RunFileError(f"{where}: scores of shape {probs.shape}; [samples, classes or outputs] is right")
    if targets.ndim == 0 or len(targets) != rows:
        raise RunFileError(f"{where}: targets of shape {targets.shape} for {rows} rows of scores; one per row is right")
    if not (np.isfinite(probs).all() and np.isfinite(targets.astype(float)).all()):
        raise RunFileError(f"{where}: holds NaN or infinite values; finite scores and targets are right")
    if scores.task == "classification":
        if targets.ndim != 1 or not (targets == np.round(targets)).all():
            raise RunFileError(f"{where}: targets of shape {targets.shape}; one class index per row is right")
        if targets.size and (targets.min() < 0 or targets.max() >= probs.shape[1]):
            raise RunFileError(f"{where}: a target outside the {probs.shape[1]} classes of the scores")
    elif targets.reshape(rows, -1).shape[1] != probs.shape[1]:
        raise RunFileError(f"{where}: targets of shape {targets.shape} for scores of shape {probs.shape}")
    if not (0 <= scores.total < INT_BOUND) or scores.total < rows:
        raise RunFileError(f"{where}: total {scores.total} for {rows} rows kept; at least the rows kept is right")
    return scores


def read_run(path: Path, name: str | None = None) -> Run:
    """Everything a report shows of the run in `path`: each file read by run/reader.py's rules (no
    link out, the right kind, a bounded size, a checked shape); one that breaks them is a note.

    Raises:
        DataError: `path` is not a directory, holds none of REPORTED_FILES (it names them), or is a run
            that has logged nothing yet.
    """
    if not path.exists():
        raise DataError(f"{path}: no such directory")
    if not path.is_dir():
        raise DataError(f"{path}: not a directory; give a run directory (runs/<name>/)")
    present = [f for f in REPORTED_FILES if os.path.lexists(path / f)]
    if not present:
        raise DataError(
            f"{path}: not a run directory: it has no {', '.join(REPORTED_FILES[:-1])} or {REPORTED_FILES[-1]} "
            "(gputrain train writes them into its --run-dir)"
        )
    run = Run(path=path, name=name or path.name)
    _read_config(run)
    run.summary = _read_json(run, SUMMARY, shapes.SUMMARY)
    metrics = path / METRICS
    try:
        if run_entry(path, METRICS) is not None:
            run.metrics_written = metrics.stat().st_mtime
            _read_metrics(run)
    except RunFileError as err:
        _left_out(run, err)
    lr_find = _read_json(run, LR_FIND, shapes.LR_FIND)
    run.lr_find = _checked_curve(lr_find, run) if lr_find is not None else None
    run.tune = _read_json(run, TUNE, shapes.TUNE)
    if run.steps.count == 0 and not run.evals and run.summary is None and run.lr_find is None and run.tune is None:
        state = "is empty" if metrics.is_file() else "does not exist yet"
        every = (run.config or {}).get("log", {}).get("every_steps", 10)
        every = every if is_number(every) else 10
        notes = f" ({'; '.join(run.notes)})" if run.notes else ""
        raise DataError(
            f"{path}: no metrics yet: metrics.jsonl {state}; the run logs its first row after "
            f"log.every_steps={every} steps, so run gputrain report again then{notes}"
        )
    run.env = _read_json(run, ENV, shapes.ENV)
    run.profile = _read_json(run, profile_name(None), shapes.PROFILE)
    if run.config is None and run.lr_find is not None and isinstance(run.lr_find.get("config"), dict):
        run.config = _tables(run.lr_find["config"], f"{LR_FIND}: config", run)  # the sweep's own config
    _read_scores(run)
    try:
        tail = read_tail(path, ERROR_LOG)
    except RunFileError as err:
        _left_out(run, err)
        tail = None
    if tail is not None:
        run.error_log = "\n".join(tail.splitlines()[-ERROR_LOG_LINES:])
    return run


def _checked_curve(record: dict[str, Any], run: Run) -> dict[str, Any] | None:
    """lr_find.json whose three curves are of one length (the figure draws them against each other)."""
    lengths = {len(record[key]) for key in ("lrs", "losses", "smoothed")}
    if len(lengths) > 1:
        run.notes.append(f"{LR_FIND}: lrs, losses and smoothed differ in length; the sweep is left out")
        return None
    return record


def read_runs(paths: list[Path]) -> list[Run]:
    """Several runs, each named by its directory, or by its parent too where two names collide."""
    names = [p.name for p in paths]
    runs = []
    for path in paths:
        clash = names.count(path.name) > 1
        runs.append(read_run(path, f"{path.parent.name}/{path.name}" if clash else path.name))
    return runs
