"""One candidate measured: a real `gputrain train` of a few steps in fresh processes (torchrun for
several ranks, as `train --nproc-per-node` starts them), in a temporary run directory, read back
through run/reader.py (metrics.jsonl's per-step times, summary.json's peak memory per rank).

The run logs every step and keeps nothing: no checkpoint, no TensorBoard, one validation and test
batch at its end. Its first `warmup` steps are compilation and first-touch; the throughput is the
global batch over the median time of the `timed` steps after them, and `compile_s` the warm-up
steps' time beyond the steady state's. A run that fails is a row: "oom" where it ran out of memory
(or was refused at its start by a memory limit), "timeout" where it outlived what the budget left
(its process group killed), else "failed", with the last line it printed.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputrain.run import shapes
from gputrain.run.layout import METRICS, SUMMARY
from gputrain.run.reader import RunFileError, iter_lines, parse_json, read_json
from gputrain.terminal import printable
from gputrain.tune.candidates import Candidate
from gputrain.tune.scheduler import Result

WARMUP_STEPS = 2
TIMED_STEPS = 6
EPOCHS = 100_000
"""Enough that train.max_steps ends every trial, however small the data set."""
REASON_CHARS = 200
KILL_WAIT_S = 10.0
"""After SIGTERM at the budget, how long the trial's processes have to stop before SIGKILL."""
_OOM_WORDS = (
    "out of memory",  # CUDA's
    "memoryerror",  # Python's
    "can't allocate memory",  # torch's CPU allocator
    "cannot allocate memory",  # ENOMEM
    "bad_alloc",  # C++'s (a library's allocation under a data limit)
    "data limit",  # gputrain's start-up check, naming the limit that binds
    "address-space limit",
)

FORCED = (
    "log.every_steps=1",
    "log.progress=none",
    "log.tensorboard=false",
    "log.breakdown_every=0",
    "checkpoint.enabled=false",
    "checkpoint.resume=never",
    "eval.every_epochs=0",
    "eval.every_steps=0",
    "eval.max_batches=1",
)
"""What every trial sets whatever the config says: it measures steps and keeps nothing."""

MemoryCap = Callable[[Candidate], "int | None"]
"""Bytes of RLIMIT_DATA for a candidate's processes (torchrun's ranks inherit it); None: no cap.
How a test forces a candidate to fail by memory, as `prlimit --data` would."""


@dataclass(slots=True)
class TrainTrial:
    """Runs candidates as `gputrain train` with the user's --config and overrides under them."""

    config_file: str | None
    overrides: Sequence[str]
    batch_size: int
    warmup: int = WARMUP_STEPS
    timed: int = TIMED_STEPS
    memory_cap: MemoryCap = field(default=lambda c: None)
    keep_dir: Path | None = None
    """Where the trials' run directories go (removed after reading); None: the system's temp."""

    def command(self, candidate: Candidate, run_dir: Path) -> list[str]:
        launch = ["--nproc-per-node", str(candidate.ranks)] if candidate.ranks > 1 else []
        steps = self.warmup + self.timed
        return [
            sys.executable,
            "-m",
            "gputrain",
            "train",
            "--run-dir",
            str(run_dir),
            *launch,
            *(["--config", self.config_file] if self.config_file else []),
            *self.overrides,
            *candidate.overrides(),
            *FORCED,
            f"train.max_steps={steps}",
            f"train.epochs={EPOCHS}",
        ]

    def __call__(self, candidate: Candidate, timeout_s: float) -> Result:
        folder = Path(tempfile.mkdtemp(prefix="gputrain-tune-", dir=self.keep_dir))
        try:
            return self._run(candidate, folder / "run", timeout_s)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run(self, candidate: Candidate, run_dir: Path, timeout_s: float) -> Result:
        cap = self.memory_cap(candidate)
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        proc = subprocess.Popen(
            self.command(candidate, run_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: a timeout stops torchrun and every rank
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))) if cap else None,
        )
        try:
            out, _ = proc.communicate(timeout=max(0.1, timeout_s))
        except subprocess.TimeoutExpired:
            _stop(proc)
            return Result(candidate, "timeout", f"still running when the budget ran out ({timeout_s:.0f} s left)")
        except BaseException:  # Ctrl-C: its own session does not get the terminal's signal; stop it here
            _stop(proc)
            raise
        text = out.decode("utf-8", errors="replace")
        if proc.returncode != 0:
            return Result(candidate, _failure_kind(text, proc.returncode), _last_line(text, proc.returncode))
        return self._figures(candidate, run_dir, text)

    def _figures(self, candidate: Candidate, run_dir: Path, text: str) -> Result:
        try:
            summary = read_json(run_dir, SUMMARY, shapes.SUMMARY, notes=[]) or {}
            rows = _step_rows(run_dir)
        except RunFileError as err:
            return Result(candidate, "failed", printable(str(err))[:REASON_CHARS])
        timed = [r for r in rows if r["step"] > self.warmup]
        if summary.get("status") != "completed" or not timed:
            return Result(
                candidate,
                "failed",
                f"the run ended {summary.get('status', 'without a summary')}: " + _last_line(text, 0),
            )
        steady = statistics.median(r["step_time_s"] for r in timed)
        warm = [r["step_time_s"] for r in rows if r["step"] <= self.warmup]
        samples = self.batch_size / steady if steady > 0 else None
        per_sample = [r["tokens_per_s"] / r["samples_per_s"] for r in timed if _tokens(r)]
        train = summary.get("train") if isinstance(summary.get("train"), dict) else {}
        peaks = train.get("peak_memory_by_rank") if isinstance(train, dict) else None
        return Result(
            candidate,
            "ok",
            samples_per_s=samples,
            tokens_per_s=samples * per_sample[0] if samples and per_sample else None,
            step_time_s=steady,
            compile_s=max(0.0, sum(warm) - steady * len(warm)) if warm else None,
            peak_memory_by_rank=[int(p) if isinstance(p, (int, float)) else None for p in peaks or []],
        )


def _tokens(row: dict[str, Any]) -> bool:
    return (
        isinstance(row.get("tokens_per_s"), (int, float))
        and isinstance(row.get("samples_per_s"), (int, float))
        and row["samples_per_s"] > 0
    )


def _step_rows(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's training rows (a step and its time), by run/reader.py's rules."""
    rows = []
    for line in iter_lines(run_dir, METRICS):
        if line is None or not line.strip():
            continue
        row = parse_json(line, str(run_dir / METRICS))
        if (
            isinstance(row, dict)
            and isinstance(row.get("step"), int)
            and isinstance(row.get("step_time_s"), (int, float))
            and row["step_time_s"] >= 0
        ):
            rows.append(row)
    return rows


def _failure_kind(text: str, returncode: int) -> str:
    lower = text.lower()
    if returncode in (-signal.SIGKILL, 137) or any(w in lower for w in _OOM_WORDS):
        return "oom"
    return "failed"


def _last_line(text: str, returncode: int) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines else f"exit status {returncode}, nothing printed"
    return printable(line)[:REASON_CHARS]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the trial's process groups, SIGKILL to what lingers: its own (the command, torchrun)
    and those of its descendants (torchrun starts each rank in a session of its own), found before the
    first signal, so a rank whose parent is gone is still reached."""
    groups = {proc.pid} | {g for g in map(_group, _descendants(proc.pid)) if g is not None} - {os.getpgrp()}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        try:
            proc.communicate(timeout=KILL_WAIT_S)
            if sig == signal.SIGKILL or not any(_alive_group(g) for g in groups):
                return
        except subprocess.TimeoutExpired:
            continue


def _descendants(pid: int) -> list[int]:
    """The processes below `pid` (Linux /proc; none where it cannot be read)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
            found += children
            todo += children
    return found


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _alive_group(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
