"""One experiment tracker as a sink (observe/trackers.py gathers the run's): what it records of
the run (`RunFacts`), a row's figures under the names every tracker uses, trackers.json, and
`TrackerSink`, whose library calls run on a thread of its own.

The training thread only appends a row to a list (`write`) and hands the list over at each flush;
the tracker's thread makes every call into the tracker's library, the start (which may reach a
server) included. The first failure of a call, at the start or mid-run, is one warning naming
the tracker and the reason; the tracker then drops what comes after it (no retries).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.config import Config
from gputrain.config.load import config_to_dict
from gputrain.errors import first_line
from gputrain.run.files import write_json
from gputrain.run.layout import TRACKERS

log = logging.getLogger("gputrain")

END_WAIT_S = 300.0
"""How long the run's end waits for a tracker to take the summary and the artifacts (a slow upload
of the weights); past it the tracker is reported failed and the run ends without it."""

Row = tuple[dict[str, Any], float]
"""A logged row and the time it was written (seconds since the epoch)."""

_RECORD_KEYS = ("step", "epoch", "split")
"""A row's keys that place it, not figures of it."""


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What a tracker records of the run beside its rows."""

    config: Config
    """The resolved config (params)."""
    run_dir: Path
    device: str
    precision: str
    world_size: int
    resume_step: int | None
    """The step the run resumed from; None: a run of its own (a new tracker run)."""

    def params(self) -> dict[str, str]:
        """The config flattened to dotted keys (`optim.lr`), each value as text."""
        return {
            f"{section}.{key}": value if isinstance(value, str) else json.dumps(value, default=str)
            for section, values in config_to_dict(self.config).items()
            for key, value in values.items()
        }

    def tags(self) -> dict[str, str]:
        # the package has loaded before any of its modules; read, not imported (gputrain imports
        # the Trainer, which would make an import circle of this module)
        version = getattr(sys.modules.get("gputrain"), "__version__", "unknown")
        return {
            "gputrain.device": self.device,
            "gputrain.precision": self.precision,
            "gputrain.world_size": str(self.world_size),
            "gputrain.version": version,
            "gputrain.run_dir": str(self.run_dir.resolve()),
        }


def figures(record: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """A row's numeric figures as `split/key` (train/loss, val/accuracy), as TensorBoard names them;
    a null (a gradient norm not measured) is no figure."""
    split = record.get("split", "train")
    for key, value in record.items():
        if key not in _RECORD_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{split}/{key}", float(value)


def summary_figures(summary: dict[str, Any], prefix: str = "summary") -> dict[str, float]:
    """summary.json's finite numbers under dotted keys (summary.train.samples_per_s)."""
    out: dict[str, float] = {}
    for key, value in summary.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            out.update(summary_figures(value, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


# ----------------------------------------------------------------- trackers.json

_FILE_LOCK = threading.Lock()
"""The trackers' threads each write their entry of trackers.json."""


def saved_run(run_dir: Path, tracker: str) -> dict[str, Any]:
    """The entry of `tracker` in the run directory's trackers.json; {} where there is none (or the file is damaged)."""
    with _FILE_LOCK, contextlib.suppress(OSError, ValueError):
        saved = json.loads((run_dir / TRACKERS).read_text(encoding="utf-8"))
        entry = saved.get(tracker) if isinstance(saved, dict) else None
        return entry if isinstance(entry, dict) else {}
    return {}


def save_run(run_dir: Path, tracker: str, entry: dict[str, Any]) -> None:
    """Keep `tracker`'s run in trackers.json, beside the other trackers' (written atomically)."""
    with _FILE_LOCK:
        try:
            saved = json.loads((run_dir / TRACKERS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        saved = saved if isinstance(saved, dict) else {}
        saved[tracker] = entry
        write_json(run_dir / TRACKERS, saved)


# ----------------------------------------------------------------- one tracker


class TrackerSink:
    """A sink whose library calls run on a thread of its own; a subclass supplies the calls:
    `start` (open or continue the tracker's run), `log_rows`, `finish` (summary, status,
    artifacts), `store` (summary.json) and `end` (close the tracker's run).

    Args:
        name: the tracker, in warnings and summary.json ("mlflow", "wandb").
        facts: what the tracker records of the run.
    """

    name = "tracker"

    def __init__(self, facts: RunFacts) -> None:
        self.facts = facts
        self.failed: str | None = None
        """Why the tracker failed (it logs nothing more); None while it works."""
        self.info: dict[str, Any] = {}
        """What summary.json says of the tracker's run (its id, where it is)."""
        self._rows: list[Row] = []
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], bool] | None] = queue.SimpleQueue()
        """(job, whether it runs after a failure too): the tracker's calls, done in order."""
        self._thread = threading.Thread(target=self._work, name=f"gputrain-{self.name}", daemon=True)
        self.call(self.start)
        self._thread.start()

    # the training thread: a list append a row, one queue put a flush
    def write(self, record: dict[str, Any]) -> None:
        if self.failed is None:
            self._rows.append((record, time.time()))

    def flush(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            self._jobs.put((lambda: self.log_rows(rows), False))

    def close(self) -> None:
        """The rows only: the tracker's run stays open for the summary (`Trackers.finish`)."""
        self.flush()

    # the tracker's thread
    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, always = item
            if always:
                job()
            elif self.failed is None:
                try:
                    job()
                except Exception as exc:  # noqa: BLE001 - any failure of the tracker is its own, never the run's
                    self.fail(f"{type(exc).__name__}: {first_line(exc)}")

    def fail(self, reason: str) -> None:
        """Stop logging to this tracker, with the one warning that says so."""
        if self.failed is None:
            self.failed = reason
            self._rows = []
            log.warning("%s: %s; training goes on without it", self.name, reason)

    def call(self, job: Callable[[], None]) -> None:
        """Run `job` on the tracker's thread, after what is queued."""
        self._jobs.put((job, False))

    def wait(self, deadline: float) -> None:
        """Until the thread has done what is queued, or `deadline` (time.monotonic) has passed."""
        done = threading.Event()
        self._jobs.put((done.set, True))
        if not done.wait(max(0.0, deadline - time.monotonic())):
            self.fail(f"did not answer within {END_WAIT_S:.0f} s at the run's end")

    def stop(self) -> None:
        self._jobs.put(None)

    def status(self) -> dict[str, Any]:
        if self.failed is not None:
            return {"status": "failed", "error": self.failed, **self.info}
        return {"status": "logged", **self.info}

    def end_lines(self) -> list[str]:
        """What the console says of the tracker at the end (how to upload an offline run)."""
        return []

    # what a tracker does (on its thread)
    def start(self) -> None:
        raise NotImplementedError

    def log_rows(self, rows: list[Row]) -> None:
        raise NotImplementedError

    def finish(self, summary: dict[str, Any]) -> None:
        raise NotImplementedError

    def store(self, summary_path: Path) -> None:
        raise NotImplementedError

    def end(self, status: str) -> None:
        raise NotImplementedError
