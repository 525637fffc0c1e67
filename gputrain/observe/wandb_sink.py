"""Weights & Biases as a tracker (log.wandb=offline|online): the config, each row's figures at its
step, and the summary. Offline, W&B writes into the run directory (RUN/wandb/offline-run-*/), and
the console says at the end how to upload it: `wandb sync RUN/wandb/offline-run-...`.

W&B's own console output (its banner, its capture of stdout) is kept out of gputrain's: silent,
console capture off, no system-metrics sampling, no git or code capture.

A resumed run continues the W&B run id trackers.json keeps (a new offline-run folder with the
same id: the console then names them all, `wandb sync RUN/wandb/offline-run-*`); a row at a step
before the last one given is not given (W&B drops a step that goes back, with a warning of its own).
A run resumed in the process that ran it (the Trainer API) is a new W&B run: see `_OPENED`.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from gputrain.observe.tracker_sink import Row, RunFacts, TrackerSink, figures, save_run, saved_run, summary_figures
from gputrain.run.layout import WANDB

PROJECT = "gputrain"
"""The W&B project where WANDB_PROJECT does not name one."""
_OPENED: set[str] = set()
"""W&B run ids opened in this process: W&B writes nothing for an id opened a second time in one
process (a Trainer resumed in the process that ran it), so that run takes a new id instead."""


class WandbSink(TrackerSink):
    """Args:
    mode: offline (files in the run directory) or online.
    facts: what the run records beside its rows.
    """

    name = "wandb"

    def __init__(self, mode: str, facts: RunFacts) -> None:
        self.mode = mode
        self._run: Any = None
        self._step = -1
        """The last step W&B was given: its steps only go forward."""
        super().__init__(facts)

    def start(self) -> None:
        import wandb

        facts = self.facts
        saved = saved_run(facts.run_dir, self.name) if facts.resume_step is not None else {}
        run_id = saved.get("id") if isinstance(saved.get("id"), str) and saved["id"] not in _OPENED else None
        (facts.run_dir / WANDB).mkdir(exist_ok=True)  # W&B writes beside `dir` otherwise (its tmp folder)
        settings = wandb.Settings(
            silent=True, console="off", x_disable_stats=True, disable_git=True, save_code=False, quiet=True
        )
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            dir=str(facts.run_dir),
            id=run_id,
            name=facts.run_dir.name,
            config=facts.params(),
            tags=None,
            mode="offline" if self.mode == "offline" else "online",
            resume="allow" if run_id else None,
            reinit="create_new",  # a second Trainer in one process is a run of its own
            settings=settings,
        )
        _OPENED.add(self._run.id)
        self._run.summary.update(facts.tags())
        save_run(facts.run_dir, self.name, {"id": self._run.id, "mode": self.mode})
        self.info = {"mode": self.mode, "id": self._run.id}
        if self.mode == "offline":
            self.info["sync_dir"] = str(self.sync_dir())

    def sync_dir(self) -> Path:
        """The offline run's folder, what `wandb sync` takes."""
        return Path(self._run.settings.sync_dir)

    def log_rows(self, rows: list[Row]) -> None:
        for record, _ in rows:
            step = int(record["step"])
            values = dict(figures(record))
            if step < self._step or not values:
                continue
            self._run.log(values, step=step)
            self._step = step

    def finish(self, summary: dict[str, Any]) -> None:
        self._run.summary.update({**summary_figures(summary), "status": str(summary.get("status"))})

    def store(self, summary_path: Path) -> None:
        """summary.json's figures went in `finish`: W&B's summary is the run's summary."""

    def end(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(exit_code=0 if status in ("completed", "stopped_early") else 1)

    def end_lines(self) -> list[str]:
        if self.mode != "offline" or self._run is None:
            return []
        folder = self.sync_dir()
        # a resumed run left a folder per attempt, all of one W&B run: sync them all, in order
        several = len(list(folder.parent.glob("offline-run-*"))) > 1
        where = f"{shlex.quote(str(folder.parent))}/offline-run-*" if several else shlex.quote(str(folder))
        return [f"wandb: offline run saved; upload it with: wandb sync {where}"]
