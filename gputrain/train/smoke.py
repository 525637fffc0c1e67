"""`train.smoke_steps=K`: a smoke test of a whole training job (Lightning's fast_dev_run), that keeps
nothing.

The run is the job itself with its length and evaluations cut down (`smoke_config`): K training
steps, a validation and a test of K batches each, and one checkpoint at the end, all in a
temporary run directory of its own (`smoke_dir`; the run directory the user named is not touched).
After the loop, the checkpoint is read back through the resume path (checked, then the weights,
optimizer, schedule, scaler and RNGs applied) and the model must hold exactly the weights it had
(`check_round_trip`). The directory is then removed and one line says what passed (`finish_smoke`).
A smoke run that fails keeps its directory: its error.log is named in the failure's message.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gputrain.config import Config
from gputrain.errors import RunError
from gputrain.train.checkpointer import Checkpointer
from gputrain.train.state import LoopState, restore_training_state

PREFIX = "gputrain-smoke-"
"""The temporary run directory's name begins so (under the system's temporary folder)."""


class SmokeParts(Protocol):
    """What the smoke run's end reads of the run's parts (train/build.py's TrainingParts)."""

    @property
    def place(self) -> Any: ...
    @property
    def checkpointer(self) -> Checkpointer: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def scheduler(self) -> Any: ...
    @property
    def precision(self) -> Any: ...
    @property
    def run_dir(self) -> Path: ...


def smoke_config(config: Config) -> Config:
    """`config` as a smoke run of train.smoke_steps=K trains it: K steps at most (fewer where the
    epochs hold fewer), validation at the end only, K batches per evaluation, no time limit, one
    checkpoint at the end (whatever checkpoint.* said), resumed from nothing."""
    steps = config.train.smoke_steps
    assert steps is not None
    return dataclasses.replace(
        config,
        train=dataclasses.replace(config.train, max_steps=steps, max_time=None),
        eval=dataclasses.replace(config.eval, every_epochs=0, every_steps=0, max_batches=steps, early_stop_metric=None),
        checkpoint=dataclasses.replace(
            config.checkpoint, enabled=True, every_steps=0, every_epochs=0, resume="auto", max_overhead=0.0
        ),
    )


def smoke_dir() -> Path:
    """A new run directory for a smoke run under the system's temporary folder: a name no one can
    guess, created only where the run claims it (run/prior.py's claim_run_dir), so bad input found
    before leaves nothing behind."""
    return Path(tempfile.gettempdir()) / f"{PREFIX}{secrets.token_hex(8)}"


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # a DTensor's shard on this rank (FSDP, TP)
    return to_local() if callable(to_local) else t


def check_round_trip(parts: SmokeParts, state: LoopState) -> Path:
    """Read the run's last checkpoint back as a resume would and check that the model holds the
    same weights and the loop the same step. Collective when several ranks run. Returns the
    checkpoint's path.

    Raises:
        RunError: no checkpoint was written, or what was read back differs.
    """
    place = parts.place
    path, verified = parts.checkpointer.resume_point()
    if path is None:
        raise RunError(f"smoke run: no checkpoint was written under {parts.run_dir} to read back")
    before = {name: _local(t).detach().clone() for name, t in parts.model.state_dict().items()}
    saved = parts.checkpointer.load(path, verified)
    restored = restore_training_state(path, saved, parts.scheduler, parts.precision, place.dist.rank, place.device)
    after = parts.model.state_dict()
    changed = [name for name, t in before.items() if not torch.equal(t, _local(after[name]))]
    if changed or restored.global_step != state.global_step:
        what = f"weights differ ({', '.join(changed[:3])})" if changed else f"step {restored.global_step}"
        raise RunError(f"smoke run: the checkpoint {path} read back does not hold the run's state: {what}")
    return path


def finish_smoke(parts: SmokeParts, state: LoopState, summary: dict[str, Any]) -> str:
    """After a smoke run's loop: the round trip, then the temporary directory removed (rank 0, once
    every rank is past reading it; every rank returns once it is gone). Returns the line that says
    what passed (rank 0 prints it)."""
    check_round_trip(parts, state)
    dist = parts.place.dist
    if dist.enabled:
        torch.distributed.barrier()
    if dist.is_main:
        shutil.rmtree(parts.run_dir, ignore_errors=True)
    if dist.enabled:  # every rank returns once the directory is gone
        torch.distributed.barrier()
    val, test = summary.get("val") or {}, summary.get("test") or {}
    evaluated = " and ".join(name for name, figures in (("validation", val), ("test", test)) if figures)
    evaluated = f"; {evaluated} of at most {parts.place.config.eval.max_batches} batches" if evaluated else ""
    return (
        f"smoke run passed: {state.global_step} training steps{evaluated}; a checkpoint saved and read back "
        f"bit for bit; nothing kept ({parts.run_dir} removed)"
    )
