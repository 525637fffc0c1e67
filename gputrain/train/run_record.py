"""Every way a run ends leaves a record: summary.json on rank 0 (status, step, figures, and for a
failure what failed) and, for failures, error.log with the traceback.

The loop runs inside `RunRecorder.recording()`; whatever leaves it (the end of training, early
stop, a signal, NaN, a crash in the user's code, in a resume, in the test evaluation or in the
final save) passes through here.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from gputrain.errors import GputrainError, Interrupted, RunError
from gputrain.train.run_files import write_json, write_text
from gputrain.train.signals import StopRequest
from gputrain.train.state import LoopState
from gputrain.train.step import StepResult
from gputrain.train.summary import build_summary

if TYPE_CHECKING:
    from gputrain.observe.console import RunConsole
    from gputrain.train.build import Placement, TrainingParts
    from gputrain.train.checkpointer import Checkpointer
    from gputrain.train.metrics import MetricsLogger


@dataclass(slots=True)
class RunEnding:
    """How the run is ending, filled in as it goes; summary.json is written from it."""

    status: str | None = None
    """completed, stopped_early, interrupted or failed; None while training goes on."""
    error: str | None = None
    val: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    last: StepResult | None = None
    """The last step's result (its loss, where no logging step came after it)."""
    started: bool = False
    """The run has resumed (or begun) and writes into its directory. A run that fails before, in
    its resume, leaves a directory that holds another run's summary as it was."""
    summary: dict[str, Any] = field(default_factory=dict)
    kept: dict[str, Any] | None = None
    """The summary of a complete run the directory already holds: nothing was trained, nothing is written."""
    doing: str | None = None
    """What the run is doing outside its steps (an evaluation), for a failure's message; None: a step."""


class RecordedParts(Protocol):
    """What RunRecorder reads of a run's parts: TrainingParts has them, and so do the parts of
    another loop (gputrain/rl/) that brings its own summary (`summarize`)."""

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


Summarize = Callable[[str, float, "float | None", RunEnding], dict[str, Any]]
"""(status, wall seconds, train loss, ending) -> the summary.json dict."""


class RunRecorder:
    """Args:
    parts: the run's parts (where the files go, the job, the console, the metrics, the speed).
    stop: the signal handler, disarmed when the run ends.
    state: the loop's current state (a resume replaces it).
    summarize: builds summary.json for a loop other than the Trainer's; by default the Trainer's
        summary from TrainingParts' figures (speed, task, evaluator).
    """

    def __init__(
        self,
        parts: RecordedParts,
        stop: StopRequest,
        state: Callable[[], LoopState],
        summarize: Summarize | None = None,
    ) -> None:
        self.parts = parts
        self.stop = stop
        self.state = state
        self.summarize = summarize or self._training_summary

    @contextlib.contextmanager
    def recording(self) -> Iterator[RunEnding]:
        started = time.perf_counter()
        ending = RunEnding()
        failure: RunError | None = None
        dist, run_dir = self.parts.place.dist, self.parts.run_dir
        try:
            yield ending
        except (Interrupted, KeyboardInterrupt):
            ending.status = "interrupted"  # a second signal leaves at once: no wait for a background save
            raise
        except BaseException as exc:
            ending.status = "failed"
            where = ending.doing or f"step {self.state().global_step + 1}"
            where += f" (rank {dist.rank})" if dist.enabled else ""
            ending.error = str(exc) if isinstance(exc, GputrainError) else f"{where}: {type(exc).__name__}: {exc}"
            log_file = run_dir / ("error.log" if dist.is_main else f"error-rank{dist.rank}.log")
            if self._may_write(ending):
                with contextlib.suppress(OSError):
                    run_dir.mkdir(parents=True, exist_ok=True)
                    write_text(log_file, traceback.format_exc())
            with contextlib.suppress(Exception):
                self.parts.checkpointer.wait()  # keep the last good checkpoint the failed run was writing
            if isinstance(exc, GputrainError) or not isinstance(exc, Exception):
                raise
            failure = RunError(f"training failed at {ending.error} (traceback in {log_file})")
        finally:
            self._record(ending, time.perf_counter() - started)
        if failure is not None:
            raise failure

    def _record(self, ending: RunEnding, wall_s: float) -> None:
        if ending.kept is not None:
            return
        parts, state = self.parts, self.state()
        parts.console.stop()
        self.stop.uninstall()
        parts.metrics.close()
        metrics = parts.metrics
        unlogged = ending.last is not None and metrics.last_logged_step != state.global_step
        loss = float(ending.last.loss) if unlogged and ending.last is not None else metrics.last_loss
        place = parts.place
        ending.summary = self.summarize(ending.status or "failed", wall_s, loss, ending)
        if place.dist.is_main:
            if self._may_write(ending):
                with contextlib.suppress(OSError):
                    parts.run_dir.mkdir(parents=True, exist_ok=True)
                    write_json(parts.run_dir / "summary.json", ending.summary)
            parts.console.final_table(ending.summary, str(parts.run_dir))

    def _training_summary(self, status: str, wall_s: float, loss: float | None, ending: RunEnding) -> dict[str, Any]:
        parts = cast("TrainingParts", self.parts)  # the default: the Trainer's parts
        place = parts.place
        return build_summary(
            status,
            wall_s,
            device=place.device,
            precision=place.precision,
            world_size=place.dist.world_size,
            state=self.state(),
            speed=parts.speed,
            train_loss=loss,
            tokens_per_sample=parts.task.tokens_per_sample,
            val=ending.val,
            test=ending.test,
            error=ending.error,
            eval_skipped=parts.evaluator.skipped,
        )

    def _may_write(self, ending: RunEnding) -> bool:
        return ending.started or not (self.parts.run_dir / "summary.json").exists()
