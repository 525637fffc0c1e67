"""What a sweep directory holds, named once (as run/layout.py names a run's files).

runs/sweep-NAME/
  sweep.json        the study: its name, storage (no password), objective, space and fixed
                    overrides (cli/sweep.py, each sweep process at its start; the report reads it)
  study.db          the Optuna study, where --storage is left at its default (SQLite)
  trial-0000/       trial 0's run directory: an ordinary gputrain run (resumable, reportable,
  trial-0001/       usable by evaluate and export); a trial retried after its sweep died keeps
  ...               the directory of the trial it repeats, and resumes it
  best.toml         the best trial's config, as `gputrain train --config best.toml` takes it
  report.html       `gputrain report SWEEP_DIR`
"""

from __future__ import annotations

from pathlib import Path

from gputrain.run.layout import REPORT  # a sweep's page takes the name a run's has

__all__ = ["BEST", "REPORT", "STUDY_DB", "SWEEP_RECORD", "TRIAL_PREFIX", "default_storage", "is_sweep_dir", "trial_dir"]

SWEEP_RECORD = "sweep.json"
STUDY_DB = "study.db"
BEST = "best.toml"
TRIAL_PREFIX = "trial-"


def trial_dir(sweep_dir: Path, number: int) -> Path:
    """The run directory of the trial numbered `number` (Optuna's number, 0-based)."""
    return sweep_dir / f"{TRIAL_PREFIX}{number:04d}"


def default_storage(sweep_dir: Path) -> str:
    """SQLite in the sweep directory: an absolute path, so every process and trial opens one file."""
    return f"sqlite:///{(sweep_dir / STUDY_DB).resolve()}"


def is_sweep_dir(path: Path) -> bool:
    """Whether `path` is a sweep directory (it holds sweep.json as a regular file)."""
    return (path / SWEEP_RECORD).is_file() and not (path / SWEEP_RECORD).is_symlink()
