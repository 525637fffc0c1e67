"""The record of a run as it goes: one row per logged step and per evaluation, written to
metrics.jsonl (and TensorBoard, MLflow, W&B: observe/trackers.py) by rank 0 and shown on its console.

The loss and gradient norm are device tensors until a logging step: only then are they read,
so the steps between logging steps never wait for the device on our account.

Rows are buffered and written out (`flush`) about every FLUSH_S seconds, after each evaluation,
before each checkpoint (the loop calls `flush`) and when the run ends however it ends (a signal,
an error): a process killed outright (SIGKILL, a node lost) loses at most the last ~FLUSH_S
seconds of rows, and never a row of a step a checkpoint holds, so a resumed run's file is whole.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gputrain.config.schema import LogConfig
from gputrain.distributed.context import DistContext
from gputrain.observe.console import RunConsole
from gputrain.observe.own_sync import own_sync
from gputrain.observe.sinks import JsonlSink, Sinks, TensorBoardSink, check_tensorboard
from gputrain.observe.speed import SpeedMeter
from gputrain.observe.trackers import RunFacts, Trackers, check_trackers, open_trackers
from gputrain.run.layout import METRICS, TENSORBOARD
from gputrain.train.state import LoopState
from gputrain.train.step import StepResult

log = logging.getLogger("gputrain")

FLUSH_S = 1.0
"""Seconds between writes of the buffered rows at most (one write per row costs a small model's
run a few percent of its time)."""


def epoch_number(state: LoopState) -> int:
    """The epoch the last step belongs to, counting from 1: every row (steps, evaluations) and the
    console number epochs this one way. After an epoch's last step and before the next one starts
    that is the finished epoch; a run that stops mid-epoch evaluates that partial epoch."""
    return state.epoch + (1 if state.step_in_epoch else 0)


class MetricsLogger:
    """Args:
    config: the `log` section.
    run_dir: where metrics.jsonl and tensorboard/ go (rank 0 only).
    dist: the job; the logged loss is the mean over all ranks.
    console: rank 0's terminal.
    speed: the run's speed meter (its figures join each row).
    optimizer: its first group's learning rate is logged.
    global_batch: samples per optimizer step.
    total_steps: the last step, which is always logged.
    tokens_per_sample: for language models, so rows carry tokens/s.
    """

    def __init__(
        self,
        config: LogConfig,
        run_dir: Path,
        dist: DistContext,
        console: RunConsole,
        speed: SpeedMeter,
        optimizer: torch.optim.Optimizer,
        global_batch: int,
        total_steps: int,
        tokens_per_sample: int | None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.dist = dist
        self.console = console
        self.speed = speed
        self.optimizer = optimizer
        self.global_batch = global_batch
        self.total_steps = total_steps
        self.tokens_per_sample = tokens_per_sample
        if config.tensorboard and dist.is_main:
            check_tensorboard()  # where open() will write, so a broken install fails now, not at step 1
        check_trackers(config)  # every rank: a missing package stops them all, before training
        self.last_loss: float | None = None
        """The loss of the last logged step, the mean over all ranks (what summary.json reports)."""
        self.last_logged_step: int | None = None
        self._sinks = Sinks([])
        self._jsonl: JsonlSink | None = None
        self.trackers = Trackers([])
        """The experiment trackers among the sinks (rank 0): run/record.py ends their runs."""
        self._flushed_at = time.monotonic()
        self._since: tuple[float, int, int] = (time.perf_counter(), 0, 0)
        """(time, samples seen, step) at the last logged step: the rates of the next row run from there."""

    def open(self, state: LoopState, resumed: bool, facts: Callable[[int | None], RunFacts] | None = None) -> None:
        """Start writing: a fresh metrics.jsonl, or, after a resume, one cut back to the rows the
        checkpoint holds (`state.metrics_rows`; its step, for a checkpoint older than that count).
        `facts`, given the resumed step: what the trackers record of the run (None: no trackers)."""
        if self.dist.is_main:
            resume_step = state.global_step if resumed else None
            self._jsonl = JsonlSink(self.run_dir / METRICS, resume_step, state.metrics_rows if resumed else None)
            sinks: list[Any] = [self._jsonl]
            if self.config.tensorboard:
                sinks.append(TensorBoardSink(self.run_dir / TENSORBOARD, resume_step))
            if facts is not None:
                self.trackers = Trackers(open_trackers(self.config, facts(resume_step)))
                sinks += self.trackers.trackers
            self._sinks = Sinks(sinks)
        self._since = (time.perf_counter(), state.samples_seen, state.global_step)

    def due(self, step: int) -> bool:
        """Whether step `step` (1-based) is a logging step: every `log.every_steps`, and the last."""
        return step % self.config.every_steps == 0 or step == self.total_steps

    def log_step(self, state: LoopState, result: StepResult) -> dict[str, Any]:
        """Write the row of a logging step (`due`); the one place the step's tensors reach the host.
        Collective: every rank calls it, for the loss averaged over ranks. Returns the row (host
        values, the same on every rank but the speed figures): what callbacks' on_step_end gets."""
        now = time.perf_counter()
        since_time, since_samples, since_step = self._since
        seconds = max(now - since_time, 1e-9)
        with own_sync():
            # the mean loss over ranks, and every rank's peak memory on the same all-reduce
            loss = self.speed.memory.mean_loss_and_peaks(result.loss, state.global_step)
            samples_per_s = (state.samples_seen - since_samples) / seconds
            record: dict[str, Any] = {
                "step": state.global_step,
                "epoch": epoch_number(state),
                "loss": loss,
                "lr": self.optimizer.param_groups[0]["lr"],
                "grad_norm": None if result.grad_norm is None else float(result.grad_norm),
                "samples_per_s": samples_per_s,
            }
            if self.tokens_per_sample is not None:
                record["tokens_per_s"] = samples_per_s * self.tokens_per_sample
            record.update(self.speed.record_fields(state.global_step - since_step, now - since_time))
        self.last_loss, self.last_logged_step = loss, state.global_step
        if not math.isfinite(loss):
            log.warning("step %d: loss is %s", state.global_step, loss)
        self._write(record)
        self.console.logged(record, self.total_steps)
        self._since = (time.perf_counter(), state.samples_seen, state.global_step)
        return record

    def samples_per_s(self, state: LoopState) -> float:
        """Samples (the RL loop's: environment steps) per second since the last row."""
        since_time, since_samples, _ = self._since
        return (state.samples_seen - since_samples) / max(time.perf_counter() - since_time, 1e-9)

    def log_record(self, record: dict[str, Any], state: LoopState) -> None:
        """Write a row another loop built (the RL loop's iteration rows: their own `step` and
        figures) to metrics.jsonl and TensorBoard; rank 0 writes, the other ranks have no sinks.
        A `loss` in the row becomes the loss summary.json reports; the next row's rates run from here."""
        self._write(record)
        self.last_logged_step = record["step"]
        if isinstance(record.get("loss"), float):
            self.last_loss = record["loss"]
        self._since = (time.perf_counter(), state.samples_seen, state.global_step)

    def log_eval(self, split: str, state: LoopState, metrics: dict[str, float]) -> None:
        """A row for an evaluation of `split` ("val" after each epoch, "test" at the end)."""
        if metrics:
            epoch = epoch_number(state)
            self._sinks.write({"step": state.global_step, "epoch": epoch, "split": split, **metrics})
            self.flush()
            self.console.evaluated(
                split,
                epoch if split == "val" else None,
                metrics,
                partial_at=state.global_step if state.step_in_epoch else None,
            )

    def _write(self, record: dict[str, Any]) -> None:
        self._sinks.write(record)
        if time.monotonic() - self._flushed_at >= FLUSH_S:
            self.flush()

    @property
    def rows(self) -> int | None:
        """The rows metrics.jsonl holds (rank 0); None on the other ranks, which write none."""
        return self._jsonl.rows if self._jsonl is not None else None

    def flush(self) -> None:
        """Write out the buffered rows (before a checkpoint: the rows of the steps it holds)."""
        self._sinks.flush()
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        self._sinks.close()
        self._sinks = Sinks([])
