"""Experiment trackers (MLflow, Weights & Biases) as sinks beside metrics.jsonl and TensorBoard:
fed the same rows the metrics logger writes (train/metrics.py), on rank 0 only. Each never stops
or slows training (observe/tracker_sink.py: its calls on a thread of its own, one warning at its
first failure, no retries), and summary.json says what became of it (`Trackers.finish`).

At the run's end (run/record.py) `finish` hands each tracker the summary (its figures, the
status, the run's files as artifacts), then `store` the written summary.json, and ends the
tracker's run. Each waits for the trackers' threads, at most END_WAIT_S seconds.

trackers.json in the run directory (run/layout.py's TRACKERS) keeps which tracker runs this run
logs to, so a resumed run continues them (mlflow_sink.py, wandb_sink.py).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputrain.config.schema import LogConfig
from gputrain.errors import ConfigError
from gputrain.observe.tracker_sink import END_WAIT_S, RunFacts, TrackerSink

__all__ = ["END_WAIT_S", "RunFacts", "TrackerSink", "Trackers", "check_trackers", "open_trackers"]


def check_trackers(config: LogConfig) -> None:
    """Before training: a tracker the config asks for whose package is missing is one line naming
    the extra that installs it (exit 2). Cheap (no import), so every rank checks and all stop together.

    Raises:
        ConfigError: naming log.mlflow or log.wandb.
    """
    for field, package, off, wanted in (
        ("log.mlflow", "mlflow", "unset log.mlflow", bool(config.mlflow)),
        ("log.wandb", "wandb", "set log.wandb=off", config.wandb != "off"),
    ):
        if wanted and importlib.util.find_spec(package) is None:
            raise ConfigError(
                field, f"the {package} package is not installed: pip install 'gputrain[{package}]', or {off}"
            )


# ----------------------------------------------------------------- the run's trackers


def open_trackers(config: LogConfig, facts: RunFacts) -> list[TrackerSink]:
    """The trackers `config` asks for, each starting its run on its own thread (rank 0 only)."""
    trackers: list[TrackerSink] = []
    if config.mlflow:
        from gputrain.observe.mlflow_sink import MlflowSink

        trackers.append(MlflowSink(config.mlflow, facts))
    if config.wandb != "off":
        from gputrain.observe.wandb_sink import WandbSink

        trackers.append(WandbSink(config.wandb, facts))
    return trackers


class Trackers:
    """The run's trackers at its end (run/record.py): the summary, the artifacts, their status."""

    def __init__(self, trackers: list[TrackerSink]) -> None:
        self.trackers = trackers
        self._abandoned = False
        """A second interrupt came while waiting for them: the run's record is written without them."""

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Hand every tracker the summary and the run's files; returns what summary.json says of them."""
        return self._all(lambda t: t.call(lambda: t.finish(dict(summary))))

    def store(self, summary_path: Path, status: str) -> dict[str, Any]:
        """Hand every tracker summary.json as written and end its run; returns their status now."""

        def store_and_end(tracker: TrackerSink) -> None:
            tracker.call(lambda: tracker.store(summary_path))
            tracker.call(lambda: tracker.end(status))

        result = self._all(store_and_end)
        for tracker in self.trackers:
            tracker.stop()
        return result

    def end_lines(self) -> list[str]:
        return [line for t in self.trackers if t.failed is None for line in t.end_lines()]

    def _all(self, queue_job: Callable[[TrackerSink], object]) -> dict[str, Any]:
        for tracker in self.trackers:
            queue_job(tracker)
        deadline = time.monotonic() + (0.0 if self._abandoned else END_WAIT_S)
        try:
            for tracker in self.trackers:
                tracker.wait(deadline)
        except KeyboardInterrupt:  # Ctrl-C again while an upload goes on: summary.json comes first
            self._abandoned = True
            for tracker in self.trackers:
                tracker.fail("abandoned at the run's end (interrupted)")
        return {t.name: t.status() for t in self.trackers}
