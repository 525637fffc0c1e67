"""Every way a run ends leaves a record: summary.json on rank 0 (status, step, figures, and for a
failure what failed) and, for failures, error.log with the traceback. The experiment trackers'
runs end here too, with the summary and the run's files (observe/trackers.py), and summary.json
says what became of each.

The loop runs inside `RunRecorder.recording()`; whatever leaves it (the end of training, early
stop, a signal, NaN, a crash in the user's code, in a resume, in the test evaluation or in the
final save) passes through here.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gputrain.distributed.rank_failure import leaves_it_to_the_launcher
from gputrain.errors import GputrainError, Interrupted, RunError, UsageError, first_line
from gputrain.interrupts import job_rank
from gputrain.run import left_memory
from gputrain.run.files import write_json, write_text
from gputrain.run.fs_errors import said
from gputrain.run.layout import SUMMARY, error_log_name
from gputrain.run.lock import run_dir_locked
from gputrain.run.prior import prior_run
from gputrain.run.signals import StopRequest
from gputrain.run.summary import build_summary, start_up_summary
from gputrain.train.state import LoopState

if TYPE_CHECKING:
    import torch

    from gputrain.observe.console import RunConsole
    from gputrain.observe.speed import SpeedMeter
    from gputrain.train.build import Placement
    from gputrain.train.checkpointer import Checkpointer
    from gputrain.train.metrics import MetricsLogger


@dataclass(slots=True)
class RunEnding:
    """How the run is ending, filled in by the shell and the record; summary.json is written from it."""

    status: str | None = None
    """completed, stopped_early, interrupted or failed; None while training goes on."""
    error: str | None = None
    started: bool = False
    """The run has resumed (or begun) and writes into its directory. A run that fails before, in
    its resume, leaves a directory that holds another run's files as they were."""
    refused: bool = False
    """The run was refused before it began, as bad input (a UsageError: a checkpoint that is not
    this run's, a directory that holds another run): nothing is written, nothing is shown as failed."""
    summary: dict[str, Any] = field(default_factory=dict)
    kept: dict[str, Any] | None = None
    """The summary of a complete run the directory already holds: nothing was trained, nothing is written."""
    doing: str | None = None
    """What the run is doing outside its steps (an evaluation), for a failure's message; None: a step."""


@dataclass(frozen=True, slots=True)
class LoopFigures:
    """What a loop adds to summary.json beyond what every run has (build_summary's common figures)."""

    last_loss: torch.Tensor | None = None
    """The last step's loss on the device, the train loss where no logging step came after it."""
    tokens_per_sample: int | None = None
    val: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    eval_skipped: dict[str, int] | None = None
    compile: str | None = None
    """What became of train.compile (train/compile_check.py)."""
    blocks: dict[str, Any] = field(default_factory=dict)
    """The loop's own blocks of summary.json (PPO's "rl")."""


class RecordedParts(Protocol):
    """What RunRecorder reads of a run's parts: the Trainer's TrainingParts and PPO's RLParts have them."""

    @property
    def place(self) -> Placement: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def console(self) -> RunConsole: ...
    @property
    def metrics(self) -> MetricsLogger: ...
    @property
    def checkpointer(self) -> Checkpointer: ...
    @property
    def speed(self) -> SpeedMeter: ...


class RunRecorder:
    """Args:
    parts: the run's parts (where the files go, the job, the console, the metrics, the speed).
    stop: the signal handler, disarmed when the run ends.
    state: the loop's counters (one object for the whole run: a resume fills it in place).
    figures: the loop's own figures for summary.json, given the run's status.
    """

    def __init__(
        self,
        parts: RecordedParts,
        stop: StopRequest,
        state: LoopState,
        figures: Callable[[str], LoopFigures],
    ) -> None:
        self.parts = parts
        self.stop = stop
        self.state = state
        self.figures = figures
        self._fresh = True
        """The run directory held no run to keep when the recording began."""

    @contextlib.contextmanager
    def recording(self) -> Iterator[RunEnding]:
        """Around a loop: the run directory held for this run alone (lock.py), and its record
        written however the loop ends."""
        with run_dir_locked(self.parts.run_dir, self.parts.place.dist), self._recording() as ending:
            yield ending

    @contextlib.contextmanager
    def _recording(self) -> Iterator[RunEnding]:
        started = time.perf_counter()
        ending = RunEnding()
        failure: RunError | None = None
        dist, run_dir = self.parts.place.dist, self.parts.run_dir
        # a directory that holds no run to keep (none, or an attempt that left nothing to continue)
        # may take the record of a run that failed before it began
        prior = prior_run(run_dir)
        self._fresh = prior is None or not prior.owns
        try:
            yield ending
        except (Interrupted, KeyboardInterrupt):
            ending.status = "interrupted"  # a second signal leaves at once: no wait for a background save
            raise
        except BaseException as exc:
            ending.status = "failed"
            ending.refused = isinstance(exc, UsageError) and not ending.started
            where = ending.doing or f"step {self.state.global_step + 1}"
            where += f" (rank {dist.rank})" if dist.enabled else ""
            ending.error = str(exc) if isinstance(exc, GputrainError) else f"{where}: {_what_failed(exc)}"
            log_file = _error_log(run_dir, dist.rank)
            writes = self._writes(ending)
            kept = _save_traceback(run_dir, log_file) if writes else _left_as_it_was(run_dir)
            with contextlib.suppress(Exception):
                self.parts.checkpointer.wait()  # keep the last good checkpoint the failed run was writing
            if isinstance(exc, GputrainError) or not isinstance(exc, Exception):
                raise
            # a collective a dead peer broke: gputrain's launcher names that peer, this in its line
            quiet = leaves_it_to_the_launcher(exc, dist.enabled)
            failure = RunError(f"training failed at {ending.error} ({kept})", shown=quiet)
        finally:
            self._record(ending, time.perf_counter() - started)
        if failure is not None:
            raise failure

    def _record(self, ending: RunEnding, wall_s: float) -> None:
        parts, state = self.parts, self.state
        parts.console.stop()
        self.stop.uninstall()  # also where a complete run was kept: the handlers were armed at the start
        if ending.kept is not None:
            return
        late = _close_metrics(parts.metrics, ending)
        metrics, status = parts.metrics, ending.status or "failed"
        figures = self.figures(status)
        unlogged = figures.last_loss is not None and metrics.last_logged_step != state.global_step
        loss = float(figures.last_loss) if unlogged and figures.last_loss is not None else metrics.last_loss
        place = parts.place
        if place.dist.enabled and self._writes(ending) and not parts.speed.memory.met_at(state.global_step):
            # the ranks end apart (no gather at the end): each leaves its peak, rank 0 takes what is there
            if place.dist.is_main:
                left_memory.take(parts.run_dir, parts.speed.memory)
            else:
                left_memory.leave(parts.run_dir, parts.speed.memory, state.global_step)
        ending.summary = build_summary(
            status,
            wall_s,
            device=place.device,
            precision=place.precision,
            world_size=place.dist.world_size,
            state=state,
            speed=parts.speed,
            train_loss=loss,
            tokens_per_sample=figures.tokens_per_sample,
            val=figures.val,
            test=figures.test,
            error=ending.error,
            eval_skipped=figures.eval_skipped,
            compile=figures.compile,
        )
        ending.summary.update(figures.blocks)
        if status == "interrupted":  # which signal ended it (null where it reached another rank only)
            requested = self.stop.requested
            ending.summary["signal"] = requested if requested and requested.startswith("SIG") else None
        trackers = metrics.trackers  # rank 0's, once the run has begun writing
        if trackers:  # the summary, the run's files; what became of each goes into summary.json
            ending.summary["trackers"] = trackers.finish(ending.summary)
        if place.dist.is_main and self._writes(ending):  # else no record, and no table of one
            _write_summary(parts.run_dir, ending.summary)
            if trackers:
                told = ending.summary["trackers"]
                ending.summary["trackers"] = trackers.store(parts.run_dir / SUMMARY, status)
                if ending.summary["trackers"] != told:  # a tracker failed taking summary.json
                    _write_summary(parts.run_dir, ending.summary)
            parts.console.final_table(ending.summary, str(parts.run_dir))
            for line in trackers.end_lines():
                parts.console.command(line)
        elif trackers:
            trackers.store(parts.run_dir / SUMMARY, status)
        if late is not None:
            raise late

    def _writes(self, ending: RunEnding) -> bool:
        """Whether this ending is recorded in the run directory: once the run has begun writing there;
        before, only for a failure (not bad input refused) in a directory that held no run. A
        directory holding another run's files is left as it was, whatever ended this one."""
        return ending.started or (self._fresh and not ending.refused)


@contextlib.contextmanager
def recording_start_up(run_dir: Path | None) -> Iterator[None]:
    """Around building a run's parts (data, model, placement), before `RunRecorder` exists: a failure
    there that is not bad input (an allocation that fails while the model materialises, a bug in a
    model's or a data set's code) is recorded as a failure in the loop is: error.log with the
    traceback and summary.json "failed" at step 0, where the directory holds no run to keep, and one
    line (RunError) instead of a traceback. Bad input and signals pass as they are."""
    began = time.perf_counter()
    try:
        yield
    except (GputrainError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the parts' code is recorded, then one line
        failed = said(exc) or f"{type(exc).__name__}: {first_line(exc)}"
        error = f"start-up (building the data, the model and its placement): {failed}"
        rank = job_rank()
        prior = prior_run(run_dir) if run_dir is not None else None
        kept = "not recorded: no run directory yet"
        if run_dir is not None and (prior is None or not prior.owns):
            kept = _save_traceback(run_dir, _error_log(run_dir, rank))
            if rank == 0:
                _write_summary(run_dir, start_up_summary(error, time.perf_counter() - began, _world_size()))
        elif run_dir is not None:
            kept = _left_as_it_was(run_dir)
        raise RunError(f"training failed at {error} ({kept})") from None


def _close_metrics(metrics: MetricsLogger, ending: RunEnding) -> RunError | None:
    """Close metrics.jsonl. Its last rows may fail to be written only now (a file made immutable, a
    full disk): a run that had not failed otherwise fails for it, recorded as such (the error to
    raise once summary.json is written); a run that failed already keeps its own error."""
    try:
        metrics.close()
    except OSError as err:
        if ending.status == "failed":
            return None
        ending.status, ending.error = "failed", f"closing the run's metrics: {_what_failed(err)}"
        return RunError(f"training failed at {ending.error}")
    return None


def _what_failed(exc: BaseException) -> str:
    """A failure's line: a file system's failure said as what it is (run/fs_errors.py), any other
    error by its type and message."""
    return said(exc) or f"{type(exc).__name__}: {exc}"


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """summary.json; where it cannot be written (the failure that ended the run may be the file
    system's), one line on stderr says so, rather than a record that silently is not there."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / SUMMARY, summary)
    except OSError as err:
        why = said(err, run_dir / SUMMARY) or f"{run_dir / SUMMARY}: {err.strerror or err}"
        with contextlib.suppress(OSError, ValueError):
            print(f"gputrain: the run's summary.json could not be written: {why}", file=sys.stderr)


def _error_log(run_dir: Path, rank: int) -> Path:
    """Where a failure's traceback goes: error.log for rank 0, error-rank<N>.log for another rank."""
    return run_dir / error_log_name(rank)


def _save_traceback(run_dir: Path, log_file: Path) -> str:
    """Write the traceback being handled to `log_file`; say where it is, or that it could not be
    written (a full disk): never a file that is not there."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(log_file, traceback.format_exc())
    except OSError:
        return f"no traceback: {log_file} could not be written"
    return f"traceback in {log_file}"


def _left_as_it_was(run_dir: Path) -> str:
    return f"nothing written: {run_dir} holds another run's files"


def _world_size() -> int:
    """The job's size from torchrun's environment (the process group may not exist yet)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)
