"""The run a directory holds, and whether a config may continue it.

A run directory belongs to one run: its config.toml is that run's config. A command that names a
directory holding a run continues it with that config (`load_run_config`) and refuses a config that
differs in anything but training longer (`check_same_run`); a complete run stays as it is unless
asked to train longer (`continue_run`). A run is of one kind, the loop that trains it ("train": the
Trainer, `gputrain train`; "rl": `gputrain rl`), recorded in env.json at its start (`run_kind`): one
kind's directory is never continued by the other (`check_run_kind`).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.config import Config, config_to_dict, load_config, parse_override
from gputrain.config.load import Defaults
from gputrain.errors import GputrainError, UsageError
from gputrain.run import shapes
from gputrain.run.files import (
    check_not_in_data,
    check_run_dir,
    continue_advice,
    run_dir_option,
)
from gputrain.run.layout import CHECKPOINT_GLOB, CHECKPOINTS, CONFIG, ENV, METRICS, RUN_DIRS, RUN_FILES, SUMMARY
from gputrain.run.reader import RunFileError, read_bytes, read_json

COMPLETE = ("completed", "stopped_early")
KINDS = ("train", "rl")
"""The kinds of run, each named as the command that trains it (`gputrain train`, `gputrain rl`)."""
KIND_KEY = "kind"
"""The key of env.json's "run" block that records the run's kind (run/files.py writes it)."""


@dataclass(frozen=True, slots=True)
class PriorRun:
    """What a run directory holds from an earlier run."""

    summary: dict[str, Any] | None
    """Its summary.json, where it left a readable one."""
    checkpoints: bool
    """It holds checkpoints (checkpoints/step-N)."""
    kind: str | None = None
    """Which loop trained it (KINDS), where the directory tells (`run_kind`)."""

    @property
    def complete(self) -> bool:
        return self.summary is not None and self.summary.get("status") in COMPLETE

    @property
    def owns(self) -> bool:
        """The directory is that run's: it can be continued (checkpoints) or is kept (complete).
        An earlier attempt that left neither is started over."""
        return self.checkpoints or self.complete

    def describe(self) -> str:
        if self.summary is None:
            return "a run that left no summary" + (" but checkpoints" if self.checkpoints else "")
        return f"a {self.summary.get('status')} run (step {self.summary.get('global_step')})"


def prior_run(run_dir: Path) -> PriorRun | None:
    """The earlier run `run_dir` holds, or None for a new or empty directory."""
    try:  # run/reader.py's rules: a summary out of the directory, too large or too deep is none
        summary = read_json(run_dir, SUMMARY, shapes.SUMMARY, notes=[])  # a field of a wrong kind: left out
    except RunFileError:
        summary = None
    try:
        checkpoints = any((run_dir / CHECKPOINTS).glob(CHECKPOINT_GLOB))
    except OSError:
        checkpoints = False
    if summary is None and not checkpoints and not os.path.lexists(run_dir / METRICS):
        return None
    summary = summary if isinstance(summary, dict) else None
    return PriorRun(summary, checkpoints, run_kind(run_dir, summary))


_SMALL_FILE = 1 << 20
"""Bytes read at most of env.json, or of metrics.jsonl's first line, to tell a run's kind."""


def _regular_file(path: Path) -> bool:
    """A regular file (a FIFO's read would block, a device's never end)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def run_kind(run_dir: Path, summary: dict[str, Any] | None) -> str | None:
    """The kind of run `run_dir` holds (KINDS), or None where nothing tells: env.json's "run" block
    records it from the start of a run; a directory written before it did is told by what only one
    kind writes (`summary`: its summary.json): summary.json's "rl" block, which every summary of an
    rl run has, or the first row of metrics.jsonl (an rl row counts env_steps, a train row does not)."""
    env = None
    if _regular_file(run_dir / ENV):
        try:
            with open(run_dir / ENV, encoding="utf-8") as file:
                env = json.loads(file.read(_SMALL_FILE))
        except (OSError, ValueError):
            env = None
    started = env.get("run") if isinstance(env, dict) else None
    recorded = started.get(KIND_KEY) if isinstance(started, dict) else None
    if recorded in KINDS:
        return str(recorded)
    if summary is not None and isinstance(summary.get("rl"), dict):
        return "rl"
    if summary is not None and summary.get("device") is not None:
        return "train"  # a run's own summary (one that failed before it was placed names no device)
    return _kind_of_rows(run_dir / METRICS)


def _kind_of_rows(path: Path) -> str | None:
    if not _regular_file(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            row = json.loads(file.readline(_SMALL_FILE))
    except (OSError, ValueError):
        return None
    if not isinstance(row, dict) or "step" not in row:
        return None
    return "rl" if "env_steps" in row else "train"


def check_run_kind(run_dir: Path, prior: PriorRun | None, kind: str) -> None:
    """A directory that holds a run of another kind is not this command's: `gputrain rl` never
    continues (nor writes beside) a `gputrain train` run, nor the reverse.

    Raises:
        UsageError: naming the directory, the kind it holds and the command that made it.
    """
    if prior is None or prior.kind is None or prior.kind == kind:
        return
    option = run_dir_option()
    raise UsageError(
        f"{run_dir} holds {prior.describe()} made by gputrain {prior.kind}; gputrain {kind} does not continue "
        f"another command's run (a run directory holds one run): choose another {option} for a new run"
    )


STATUSES = (*COMPLETE, "timed_out", "interrupted", "failed")
"""What summary.json's status says, for a summary a gputrain run wrote."""


def check_no_foreign_files(run_dir: Path, prior: PriorRun | None) -> None:
    """Files under a run's names that no gputrain run wrote (a project's own config.toml, a model
    folder's model.safetensors, another tool's checkpoints/) are never written over or mixed with:
    a directory that holds any of them, and no run (no config of a run, summary or checkpoint
    beside them), is refused.

    Raises:
        UsageError: naming the files.
    """
    present = [name for name in RUN_FILES if os.path.isfile(run_dir / name)]
    present += [f"{name}/" for name in RUN_DIRS if (run_dir / name).is_dir() and any((run_dir / name).iterdir())]
    if not present or _holds_a_run(run_dir, prior):
        return
    them = "them" if len(present) > 1 else "it"
    raise UsageError(
        f"{run_dir_option()} {run_dir}: holds {', '.join(present)}, which no gputrain run wrote (no run's "
        f"config, summary or checkpoint beside {them}); a run would write over {them}: choose an empty or new "
        "directory"
    )


def _holds_a_run(run_dir: Path, prior: PriorRun | None) -> bool:
    if prior is not None and (prior.checkpoints or (prior.summary or {}).get("status") in STATUSES):
        return True
    try:
        load_config(run_dir / CONFIG)
    except (GputrainError, OSError):
        return False
    return True


def saved_config(run_dir: Path, defaults: Defaults | None = None) -> Config | None:
    """The config the run in `run_dir` was trained with (its config.toml), or None where it left none.
    `defaults`: the command's own (config/load.py: rl's, which also read a config.toml written before
    the rl.* keys moved as rl meant them).

    Raises:
        UsageError: config.toml is there but cannot be read as a config.
    """
    path = run_dir / CONFIG
    if not os.path.lexists(path):
        return None
    read_bytes(run_dir, CONFIG)  # no link out, a regular file, a bounded size (RunFileError, naming it)
    try:
        return load_config(path, defaults=defaults)
    except GputrainError as err:
        reason = " ".join(str(err).split())
        raise UsageError(
            f"{path}: the config of the run in {run_dir} cannot be read ({reason}); restore it, or remove it "
            "to continue that run with the config given"
        ) from None


def continued_config(run_dir: Path | None, defaults: Defaults | None = None) -> Config | None:
    """The config of the run `run_dir` holds to continue (or a complete one), None where it holds none.

    Raises:
        UsageError: its config.toml is there but cannot be read as a config.
    """
    prior = prior_run(run_dir) if run_dir is not None else None
    return saved_config(run_dir, defaults) if run_dir is not None and prior is not None and prior.owns else None


def load_run_config(
    run_dir: Path | None, config_file: str | None, overrides: list[str], defaults: Defaults | None = None
) -> Config:
    """The config a command runs with: where `run_dir` holds a run to continue (or a complete one)
    and no --config is given, the run's own config.toml with the overrides on top (so `gputrain train
    --run-dir DIR` continues DIR as it was trained); otherwise --config (or the defaults, the
    command's own `defaults` first) with them."""
    prior = prior_run(run_dir) if run_dir is not None else None
    if run_dir is not None and config_file is None and prior is not None and prior.owns:
        saved = saved_config(run_dir, defaults)
        if saved is not None:
            # the run continues from its own checkpoints, whichever it started from (another run's)
            return load_config(saved, {"checkpoint.resume": "auto", **dict(map(parse_override, overrides))})
    return load_config(config_file, overrides, defaults)


TRAIN_LONGER = ("train.epochs", "train.max_steps", "train.max_time", "rl.total_timesteps", "rl.stop_at_return")
"""Keys whose change means "train longer": a complete run continues where they are raised (a run
that train.max_time stopped is not complete: it continues, with a raised limit, from its checkpoint)."""
FREE_TO_CHANGE = (
    "log.",
    "checkpoint.",
    "data.num_workers",
    "train.num_threads",
    "train.device",
    "train.compile",
    "train.cuda_graphs",
    "parallel.",
    "train.smoke_steps",
)
"""Keys (or sections) that change how a run is logged, saved, fed, laid out or executed, not what it
trains: a run may continue with other values (checkpoints resume on another device, world size or
strategy, compiled or not: a compiled model's weights keep their names)."""


def _may_differ(key: str) -> bool:
    return key in TRAIN_LONGER or any(
        key == free or (free.endswith(".") and key.startswith(free)) for free in FREE_TO_CHANGE
    )


def _flat(config: Config) -> dict[str, Any]:
    return {
        f"{section}.{key}": value for section, values in config_to_dict(config).items() for key, value in values.items()
    }


def config_differences(saved: Config, given: Config) -> dict[str, tuple[Any, Any]]:
    """{key: (saved value, given value)} for the keys a continued run may not change. "auto" on
    either side matches a value: the run resolved it (train.batch_size=auto becomes a number)."""
    old, new = _flat(saved), _flat(given)
    return {
        key: (old.get(key), value)
        for key, value in new.items()
        if not _may_differ(key) and old.get(key) != value and "auto" not in (old.get(key), value)
    }


def _show(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value) if isinstance(value, str) else str(value)


def check_same_run(
    run_dir: Path, config: Config, prior: PriorRun | None, defaults: Defaults | None = None, kind: str = "train"
) -> None:
    """A config given for a directory that holds a run (one to continue or a complete one) is that
    run's, of this command's `kind` (`check_run_kind`), but for training longer and the keys free to
    change.

    Raises:
        UsageError: naming the differing keys (saved vs given) and the choices.
    """
    check_run_kind(run_dir, prior, kind)
    if prior is None or not prior.owns or config.checkpoint.resume == "never":
        # a new run there (resume=never) is refused as mixing two runs (`check_resume_never`), or
        # writes nothing of a run (an LR sweep beside it)
        return
    saved = saved_config(run_dir, defaults)
    if saved is None:
        return
    differences = config_differences(saved, config)
    if not differences:
        return
    shown = [f"{key} = {_show(old)} there, {_show(new)} given" for key, (old, new) in differences.items()]
    more = f" (and {len(shown) - 3} more: {', '.join(list(differences)[3:])})" if len(shown) > 3 else ""
    option = run_dir_option()
    raise UsageError(
        f"{run_dir} holds {prior.describe()} trained with another config: {'; '.join(shown[:3])}{more}. "
        f"A run continues with its own config ({continue_advice(run_dir)}; to train it longer, change only "
        f"its length: {', '.join(TRAIN_LONGER)}), or choose another {option} for a new run"
    )


def asks_longer(saved: Config | None, given: Config) -> bool | None:
    """Whether `given` raises the length of the run `saved` describes (train.epochs, train.max_steps,
    rl.total_timesteps, rl.stop_at_return); None where no saved config tells."""
    if saved is None:
        return None
    old, new = saved.train, given.train
    raised = new.epochs > old.epochs or _raised(old.max_steps, new.max_steps)
    old_rl, new_rl = saved.rl, given.rl
    return (
        raised
        or int(new_rl.value("total_timesteps")) > int(old_rl.value("total_timesteps"))
        or _raised(old_rl.stop_at_return, new_rl.stop_at_return)
    )


def _raised(old: float | None, new: float | None) -> bool:
    """A limit raised: unset (none) is the highest."""
    return old is not None and (new is None or new > old)


def claim_run_dir(run_dir: Path, config: Config, defaults: Defaults | None = None, kind: str = "train") -> None:
    """The last check before anything heavy: the directory is not in the data it reads, holds no
    one else's files under a run's names, takes files, its entries are right, and a run it holds is
    this one, of this `kind` (`check_same_run`; `defaults`: the command's own, config/load.py)."""
    check_not_in_data(run_dir, (config.data.path, config.data.val_path))
    check_run_dir(run_dir, keep=True)  # first: its entries are of their kinds (a FIFO would block a read)
    prior = prior_run(run_dir)
    check_no_foreign_files(run_dir, prior)
    check_same_run(run_dir, config, prior, defaults, kind)


def continue_run(
    run_dir: Path,
    prior: PriorRun | None,
    resume: str,
    resume_path: Path | None,
    total_steps: int,
    longer: bool | None,
) -> bool:
    """Whether this run may train in `run_dir`: a run directory belongs to one run.

    Returns False when `run_dir` holds a complete run (completed or stopped early) that is not asked
    to train longer (`longer`: the config raises train.epochs, train.max_steps, ...; None where the
    directory keeps no config, then a run is complete at or past `total_steps`), or has nothing left
    to train: its files stay as they are. Continuing a run (checkpoint.resume=auto, or one of its
    own checkpoints) is allowed, and so is starting over where an earlier attempt left neither
    checkpoints nor a complete run.

    Raises:
        UsageError: the run would mix with another one in `run_dir`, naming the directory and the
            choices.
    """
    if prior is None:
        return True
    option = run_dir_option()
    ours = resume_path is not None and run_dir.resolve() in resume_path.resolve().parents
    step = prior.summary.get("global_step") if prior.summary is not None else None
    if prior.complete and (resume == "auto" or ours):
        done = isinstance(step, int) and step >= total_steps
        stopped_early = prior.summary is not None and prior.summary.get("status") == "stopped_early"
        if done or longer is False or (longer is None and stopped_early):
            return False
    if resume == "auto":
        if resume_path is None and prior.complete:
            raise UsageError(
                f"{run_dir} holds {prior.describe()} and no checkpoint to continue it from: choose "
                f"another {option} for a new run"
            )
        return True
    if not prior.owns:
        return True  # an earlier attempt that left nothing to continue: start over
    check_resume_never(run_dir, prior, resume)
    if ours and not prior.complete:
        return True  # this run, continued from one of its own earlier checkpoints
    raise UsageError(
        f"{run_dir} holds {prior.describe()}: continuing from {resume_path} there would "
        f"{'rewrite its records' if ours else 'mix two runs in one directory'}; choose another {option}"
    )


def check_resume_never(run_dir: Path, prior: PriorRun | None, resume: str) -> None:
    """checkpoint.resume=never starts a new run: not in a directory that holds one to keep.

    Raises:
        UsageError: naming the directory and the choices.
    """
    if resume == "never" and prior is not None and prior.owns:
        raise UsageError(
            f"{run_dir} holds {prior.describe()}: checkpoint.resume=never would mix two runs in one "
            f"directory; choose another {run_dir_option()}, or checkpoint.resume=auto to continue that run"
        )


def kept_message(run_dir: Path, prior: PriorRun, longer_keys: str) -> str:
    """The line for a complete run left as it is."""
    return (
        f"{run_dir} holds {prior.describe()}, complete: nothing to train (its summary: "
        f"{run_dir / SUMMARY}). Raise {longer_keys} to train it longer, or choose another "
        f"{run_dir_option()} for a new run"
    )
