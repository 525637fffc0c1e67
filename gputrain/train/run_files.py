"""The run directory: where it is, the small files written into it, and which run it belongs to."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.config import Config, config_to_toml
from gputrain.errors import UsageError


def default_run_dir(model_name: str, data_name: str) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{model_name}-{data_name}-{stamp}"


def write_text(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def write_run_files(run_dir: Path, config: Config) -> None:
    """The files a run directory holds from its start: the resolved config (loadable with
    --config) and the doctor's facts about this machine."""
    from gputrain.env import collect_env  # the doctor's modules: only needed once a run starts

    run_dir.mkdir(parents=True, exist_ok=True)
    write_text(run_dir / "config.toml", config_to_toml(config))
    write_json(run_dir / "env.json", collect_env().to_dict())


def check_run_dir(run_dir: Path, keep: bool = False) -> None:
    """Make sure the run directory can be created and takes files, before anything heavy is built.
    Unless `keep`, directories made for the check are removed again, so bad input found later
    leaves no trace; not with several ranks, whose checks would remove each other's directory.
    Raises UsageError naming it."""
    alone = int(os.environ.get("WORLD_SIZE", "1")) <= 1
    made = [] if keep or not alone else [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".gputrain-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UsageError(f"--run-dir {run_dir}: cannot be created or written ({err.strerror or err})") from None
    finally:
        for path in made:  # deepest first
            with contextlib.suppress(OSError):
                path.rmdir()


COMPLETE = ("completed", "stopped_early")


@dataclass(frozen=True, slots=True)
class PriorRun:
    """What a run directory holds from an earlier run."""

    summary: dict[str, Any] | None
    """Its summary.json, where it left a readable one."""
    checkpoints: bool
    """It holds checkpoints (checkpoints/step-N)."""

    @property
    def complete(self) -> bool:
        return self.summary is not None and self.summary.get("status") in COMPLETE

    def describe(self) -> str:
        if self.summary is None:
            return "a run that left no summary" + (" but checkpoints" if self.checkpoints else "")
        return f"a {self.summary.get('status')} run (step {self.summary.get('global_step')})"


def prior_run(run_dir: Path) -> PriorRun | None:
    """The earlier run `run_dir` holds, or None for a new or empty directory."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    checkpoints = any((run_dir / "checkpoints").glob("step-*"))
    if summary is None and not checkpoints and not (run_dir / "metrics.jsonl").exists():
        return None
    return PriorRun(summary if isinstance(summary, dict) else None, checkpoints)


def continue_run(
    run_dir: Path, prior: PriorRun | None, resume: str, resume_path: Path | None, total_steps: int
) -> bool:
    """Whether this run may train in `run_dir`: a run directory belongs to one run.

    Returns False when `run_dir` holds a complete run with nothing left to train: its files stay as
    they are. Continuing a run (checkpoint.resume=auto, or one of its own checkpoints) is allowed,
    and so is starting over where an earlier attempt left neither checkpoints nor a complete run.

    Raises:
        UsageError: the run would mix with another one in `run_dir`, naming the directory and the
            choices.
    """
    if prior is None:
        return True
    ours = resume_path is not None and run_dir.resolve() in resume_path.resolve().parents
    step = prior.summary.get("global_step") if prior.summary is not None else None
    if prior.complete and isinstance(step, int) and step >= total_steps and (resume == "auto" or ours):
        return False
    if resume == "auto":
        if resume_path is None and prior.complete:
            raise UsageError(
                f"{run_dir} holds {prior.describe()} and no checkpoint to continue it from: choose "
                "another --run-dir for a new run"
            )
        return True
    if not (prior.checkpoints or prior.complete):
        return True  # an earlier attempt that left nothing to continue: start over
    if resume == "never":
        raise UsageError(
            f"{run_dir} holds {prior.describe()}: checkpoint.resume=never would mix two runs in one "
            "directory; choose another --run-dir, or checkpoint.resume=auto to continue that run"
        )
    if ours and not prior.complete:
        return True  # this run, continued from one of its own earlier checkpoints
    raise UsageError(
        f"{run_dir} holds {prior.describe()}: continuing from {resume_path} there would "
        f"{'rewrite its records' if ours else 'mix two runs in one directory'}; choose another "
        "--run-dir"
    )
