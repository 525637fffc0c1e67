"""One trial: `gputrain sweep-trial` in a fresh process (the same launcher as `gputrain train`:
--nproc-per-node starts torchrun), in the trial's own run directory, then its result read back from
the run's summary.json and metrics.jsonl.

The trial process dies with the sweep process (Linux's parent-death signal: SIGTERM, on which a run
saves a checkpoint), so a sweep killed even by SIGKILL leaves no training behind, and the trial's
copy resumes that checkpoint when a sweep takes it again.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain.config.load import toml_value as toml_literal
from gputrain.run.layout import CONFIG, METRICS, SUMMARY
from gputrain.sweep.layout import trial_dir
from gputrain.sweep.pruning import PRUNED, STORAGE_ENV
from gputrain.sweep.study import RUN_DIR, Settings, heartbeat, owner_attrs, requeue

if TYPE_CHECKING:
    import optuna

LOCK_WAIT_S = 300.0
"""How long a retried trial waits for the dead trial's process to let go of its run directory
(it saves a checkpoint on its way out) before starting anyway."""


class TrialFailed(Exception):
    """The trial's run failed (or ended without a result): a failed trial, not a failed sweep."""


@dataclass(frozen=True, slots=True)
class Launch:
    """How every trial of this sweep process starts."""

    sweep_dir: Path
    study: str
    storage: str
    settings: Settings
    nproc_per_node: int | None
    heartbeat_s: float


def overrides_of(params: dict[str, Any]) -> list[str]:
    """A trial's sampled values as the command line's section.key=value (TOML literals)."""
    return [f"{key}={toml_literal(value)}" for key, value in params.items()]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the sweep process dies (Linux's PR_SET_PDEATHSIG)."""
    # not Linux: a killed sweep's trial runs to its end, then finds its trial given up
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def _wait_until_free(run_dir: Path) -> None:
    """Wait while another process holds the run directory (a dead sweep's trial saving its
    checkpoint): the run's own lock (run/lock.py), which the kernel drops when it exits."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # not there yet: a new trial
    deadline = time.monotonic() + LOCK_WAIT_S
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return  # the run refuses to start, naming the holder: a failed trial
                time.sleep(0.2)
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            return
    finally:
        os.close(fd)


def command(launch: Launch, trial: optuna.Trial, run_dir: Path) -> list[str]:
    s = launch.settings
    resumed = (run_dir / CONFIG).is_file()  # its own config.toml: it continues as it was trained
    return [
        sys.executable,
        "-m",
        "gputrain",
        "sweep-trial",
        "--study",
        launch.study,
        "--trial-id",
        str(trial._trial_id),
        "--run-dir",
        str(run_dir),
        *(["--config", s.config] if s.config and not resumed else []),
        *(["--nproc-per-node", str(launch.nproc_per_node)] if launch.nproc_per_node else []),
        *s.fixed,
        *overrides_of(trial.params),
    ]


def run_trial(study: optuna.Study, trial: optuna.Trial, launch: Launch) -> float:
    """Run `trial` to its end and return its objective.

    Raises:
        optuna.TrialPruned: the pruner stopped it.
        TrialFailed: its run failed or gave no value of the metric.
    """
    import optuna

    given = trial.user_attrs.get(RUN_DIR)  # a retried trial's: resumed
    run_dir = Path(given) if isinstance(given, str) else trial_dir(launch.sweep_dir, trial.number).resolve()
    for key, value in {**owner_attrs(), RUN_DIR: str(run_dir)}.items():
        trial.set_user_attr(key, value)
    _wait_until_free(run_dir)
    log = launch.sweep_dir / f"{run_dir.name}.log"
    env = {**os.environ, STORAGE_ENV: launch.storage}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command(launch, trial, run_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent,
        )
        try:
            with heartbeat(study, trial, launch.heartbeat_s):
                code = proc.wait()
        except BaseException:  # Ctrl-C, SIGTERM: the trial saves a checkpoint; a later sweep resumes it
            _stop(proc)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            requeue(study, study._storage.get_trial(trial._trial_id))
            raise
    return result(run_dir, launch.settings, code, log)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=LOCK_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _summary(run_dir: Path) -> dict[str, Any] | None:
    from gputrain.run.reader import parse_json, read_text

    try:
        text = read_text(run_dir, SUMMARY)
        data = parse_json(text, str(run_dir / SUMMARY)) if text is not None else None
    except Exception:  # noqa: BLE001 - a missing or broken summary is a failed trial
        return None
    return data if isinstance(data, dict) else None


def val_values(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    """(step, value) of the metric at each validation (metrics.jsonl's val rows)."""
    from gputrain.run.reader import iter_lines

    values = []
    for line in iter_lines(run_dir, METRICS):
        if line is None:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        value = row.get(metric) if isinstance(row, dict) and row.get("split") == "val" else None
        if isinstance(value, (int, float)) and math.isfinite(value) and isinstance(row.get("step"), int):
            values.append((row["step"], float(value)))
    return values


def result(run_dir: Path, settings: Settings, code: int, log: Path) -> float:
    """The objective of a trial whose process exited with `code`."""
    import optuna

    summary = _summary(run_dir)
    status = summary.get("status") if summary else None
    if status == "stopped_early" and summary and summary.get("stop_reason") == PRUNED:
        raise optuna.TrialPruned(f"pruned at step {summary.get('global_step')}")
    if status not in ("completed", "stopped_early"):
        error = summary.get("error") if summary else None
        raise TrialFailed(f"{status or 'no summary'} (exit {code}){f': {error}' if error else ''}; see {log}")
    values = [v for _, v in val_values(run_dir, settings.metric)]
    if not values:
        raise TrialFailed(f"the run logged no validation {settings.metric}; see {run_dir / METRICS}")
    if settings.objective == "final":
        return values[-1]
    return min(values) if settings.direction == "minimize" else max(values)


def describe(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in params.items())


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
