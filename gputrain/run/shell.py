"""The shell every training loop runs in: the run directory held and recorded, a resume (or a kept
complete run), checkpoints, a signal's stop and the final weights, written once for the Trainer and
for PPO. A loop supplies only its steps (`train`), what it checkpoints (`states`) and its figures
for summary.json (`figures`):

    shell = RunShell(parts, config, LoopShape(total=..., unit="step"), figures, states={"rl": envs})
    summary = shell.run(train)   # train() runs the steps and answers how the run ended

The checkpoint's training state (state.pt) holds each registered part's `state_dict()` under its
name (torchtitan's `CheckpointManager(states=...)`), with the loop's counters ("loop") and every
RNG ("rng"), so a resume puts back exactly what a save took. The LR finder writes no run record
and keeps its own short loop (train/lr_find.py): it shares the step, not the shell.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gputrain.config import Config
from gputrain.run.hold import hold
from gputrain.run.layout import FINAL_WEIGHTS
from gputrain.run.prior import PriorRun
from gputrain.run.record import LoopFigures, RecordedParts, RunEnding, RunRecorder
from gputrain.run.signals import StoppedBySignal, StopRequest
from gputrain.run.start import start_run
from gputrain.train.state import LoopState, capture_rng, restore_training_state


class Stateful(Protocol):
    """A part whose state a checkpoint holds: the LR schedule, the loss scaler, PPO's environments."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


Check = Callable[[Path, Mapping[str, Any]], None]
"""(checkpoint path, its training state) -> None, or CheckpointMismatch: a part's own check that a
checkpoint is this run's, run before anything of it is applied."""


class ShellParts(RecordedParts, Protocol):
    """What the shell reads of a loop's parts beyond what the record reads: the LR schedule and the
    loss scaler, which every loop has and every checkpoint holds."""

    @property
    def scheduler(self) -> Any: ...
    @property
    def precision(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class LoopShape:
    """How a loop counts, for the resume, the console and the messages."""

    total: int
    """The steps (or iterations) the run trains to."""
    unit: str = "step"
    longer: str = "train.epochs or train.max_steps"
    """The fields a user raises to train a complete run longer."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Plain values saved beside the state (the Trainer's task and number of classes)."""
    complete: Callable[[PriorRun | None, LoopState], bool] | None = None
    """After a resume, whether the earlier run was complete at this checkpoint already (PPO's
    rl.stop_at_return)."""
    before_save: Callable[[], None] | None = None
    """Called before a checkpoint's state is taken (the Trainer reads its guard's pending verdicts)."""
    after_save: Callable[[Path], None] | None = None
    """Called with each checkpoint's path once it is saved (the Trainer's callbacks' on_checkpoint)."""
    kind: str = "train"
    """The kind of run (run/prior.py's KINDS): recorded in env.json, and a directory holding another
    kind's run is refused."""
    config_note: str | None = None
    """Comment lines at the head of config.toml: what the run used beyond its config (a user's optimizer)."""
    tokenizer: Any = None
    """The tokenizer the run's token ids mean (text/tokenizer.py's Tokenizer), kept in the run
    directory at the start (run/tokenizer.py); None: the run has none."""


class RunShell:
    """Args:
    parts: the loop's parts (run directory, job, console, metrics, checkpointer, schedule, scaler).
    config: the run's config (config.toml, the resume rules).
    shape: how the loop counts.
    states: the loop's own checkpointed parts beyond the schedule and the scaler ({"rl": envs}).
    figures: the loop's figures for summary.json, given the run's status.
    checks: each part's check of a checkpoint before anything of it is applied.
    """

    def __init__(
        self,
        parts: ShellParts,
        config: Config,
        shape: LoopShape,
        figures: Callable[[str], LoopFigures],
        states: Mapping[str, Stateful] | None = None,
        checks: tuple[Check, ...] = (),
    ) -> None:
        self.parts, self.config, self.shape = parts, config, shape
        self.states: dict[str, Stateful] = dict(states or {})
        """The loop's own parts; the schedule and the scaler, which every loop has, are saved and
        restored beside them (restore_training_state checks and loads those two)."""
        self.checks = checks
        self.state = LoopState()
        """The loop's counters: one object for the whole run (a resume fills it in place)."""
        self.stop = StopRequest()
        self.recorder = RunRecorder(parts, self.stop, self.state, figures)
        self._ending: RunEnding | None = None
        """How the run is ending, while `run` runs."""
        self.last_ending: RunEnding | None = None
        """How the last `run` ended, its summary too, once it has (read where `run` raised)."""

    def run(self, train: Callable[[], str], closing: tuple[Any, ...] = ()) -> dict[str, Any]:
        """Resume or begin, `train()` until it answers how the run ended (completed,
        stopped_early), then the final weights; returns the summary (summary.json). `closing`: what
        ends with the run however it ends (the feed's loader workers)."""
        with self.recorder.recording() as ending, contextlib.ExitStack() as stack:
            self.last_ending = ending
            for thing in closing:
                stack.enter_context(contextlib.closing(thing))
            if not self._start(ending):
                return ending.summary  # the directory holds a complete run: it stays as it is
            self._ending = ending
            try:
                ending.status = train()
            finally:
                self._ending = None
            self.hold("final-save")
            self.parts.checkpointer.save_final_weights(self.parts.run_dir / FINAL_WEIGHTS)
            # every rank's peak memory, final save included: the ranks end here together (a failure
            # ends without it, and the summary says which ranks' figures are older: rank_memory.py)
            self.parts.speed.memory.gather(self.state.global_step)
        return ending.summary

    @contextlib.contextmanager
    def outside_steps(self, what: str) -> Iterator[None]:
        """Around work between steps (an evaluation): a failure there names `what` rather than a step."""
        ending = self._ending
        if ending is not None:
            ending.doing = what
        yield
        if ending is not None:
            ending.doing = None

    # ----------------------------------------------------------------- start and resume
    def _start(self, ending: RunEnding) -> bool:
        shape = self.shape
        return start_run(
            ending,
            self.parts,
            self.config,
            self.stop,
            shape.total,
            self.state,
            self._restore,
            longer=shape.longer,
            unit=shape.unit,
            complete=shape.complete,
            kind=shape.kind,
            config_note=shape.config_note,
            tokenizer=shape.tokenizer,
        )

    def _restore(self, path: Path, saved: dict[str, Any]) -> LoopState:
        """Every part's check first, then the weights, the schedule, the scaler and the RNGs
        (restore_training_state), then the loop's own parts; the counters are filled in place."""
        for check in self.checks:
            check(path, saved)
        place = self.parts.place
        restored = restore_training_state(
            path, saved, self.parts.scheduler, self.parts.precision, place.dist.rank, place.device
        )
        for name, part in self.states.items():
            # a part the checkpoint predates (the Trainer's callbacks) is given none: it says so itself
            part.load_state_dict(saved.get(name, {}))
        for f in dataclasses.fields(LoopState):
            setattr(self.state, f.name, getattr(restored, f.name))
        return self.state

    # ----------------------------------------------------------------- checkpoints and signals
    def save(self, periodic: bool = False) -> Path | None:
        """Checkpoint now; `periodic` (every_epochs, every_steps): the overhead rule may put it off.
        Collective when several ranks run."""

        def state_of() -> dict[str, Any]:
            # asked for only when a checkpoint takes this step: capturing every RNG costs more than a
            # small step, and a save put off costs no sync and no flush either. A checkpoint never
            # holds a step the device masked without the host knowing, nor a step whose row a kill
            # could still lose (train/metrics.py)
            if self.shape.before_save is not None:
                self.shape.before_save()
            self.parts.metrics.flush()
            parts = self.parts
            self.state.metrics_rows = parts.metrics.rows  # a resume keeps exactly the rows written so far
            return {
                "scheduler": parts.scheduler.state_dict(),
                "precision": parts.precision.state_dict(),
                **{name: part.state_dict() for name, part in self.states.items()},
                "loop": self.state.to_dict(),
                "rng": capture_rng(self.parts.place.device),
                **self.shape.meta,
            }

        state = self.state
        self.hold("checkpoint")
        path = self.parts.checkpointer.save(state.global_step, state_of, state.best_step, periodic=periodic)
        if path is not None and self.shape.after_save is not None:
            self.shape.after_save(path)
        return path

    def hold(self, point: str) -> None:
        """The test hook (run/hold.py): held at `point` until a signal has come, where a test asks."""
        hold(point, self.state.global_step, lambda: self.stop.requested is not None, self.parts.place.dist.rank)

    def stop_requested(self, sync_point: bool) -> bool:
        """Whether a signal asks the run to stop now (several ranks agree on sync points only). An
        early stop the loop asked for (`request_stop`) is agreed on the same poll: `stop.early_agreed`."""
        return self.stop.agreed(self.parts.place.dist, self.parts.place.device, sync_point)

    def request_stop(self, reason: str) -> None:
        """Ask the run to end early (stopped_early) for `reason`, from this rank; the first reason stays."""
        if self.stop.early is None:
            self.stop.early = reason

    def interrupted(self) -> None:
        """Save, wait for the save, and stop the run for the signal (exit 130)."""
        if self.shape.before_save is not None:
            self.shape.before_save()  # the summary counts every masked step, whether or not a checkpoint is saved
        path = self.save()
        self.parts.checkpointer.wait()
        self.parts.speed.memory.gather(self.state.global_step)  # the ranks agreed to stop: they are here together
        where = f"checkpoint saved at {path}; " if path else ""
        raise StoppedBySignal(
            f"stopped by {self.stop.requested} at {self.shape.unit} {self.state.global_step}; {where}",
            self.parts.run_dir,
        )
