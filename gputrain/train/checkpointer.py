"""The run's checkpoints: where to resume from, a verified load, saves with rotation, the final weights.

Three back-ends sit behind one `save`/`wait`: a plain synchronous save (one process), a background
thread (one process, `checkpoint.async_save`), and torch.distributed.checkpoint shards written by
every rank (several ranks; asynchronous too when asked). The loop never needs to know which.

In one process, a periodic save (every_epochs, every_steps) is put off while saving would take more
than `checkpoint.max_overhead` of the run's time so far: with epochs of milliseconds, a checkpoint
each epoch costs more than the epoch (a 20-epoch tiny MLP spent 20-25% of its time saving). A new
best that is put off is copied to host memory and written with the next save, so the best
checkpoint is never lost to the rule; the run's end, early stop and a signal always save. Several
ranks save every time: their clocks differ, and a save is collective.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gputrain.checkpoint import (
    CorruptCheckpoint,
    find_resumable,
    read_checkpoint,
    rotate_checkpoints,
    save_checkpoint,
)
from gputrain.checkpoint.async_save import AsyncSaver, HostCopy
from gputrain.checkpoint.io import checkpoint_step, save_weights
from gputrain.config.paths import check_resume_setting
from gputrain.config.schema import CheckpointConfig
from gputrain.distributed.context import DistContext
from gputrain.errors import RunError
from gputrain.run.layout import CHECKPOINTS, checkpoints_folder
from gputrain.train.state import CheckedCheckpoint


class Checkpointer:
    """Args:
    config: the `checkpoint` section.
    run_dir: the run directory; checkpoints go to `run_dir/checkpoints/step-<N>/`.
    dist: this rank's place in the job (sharded saves and loads when several ranks run).
    model: the module that holds this rank's parameters (its state dict is saved).
    optimizer: saved and restored with the model.
    pipelined: the model is a pipeline stage (every stage writes its part of the final weights).
    clock: seconds, for the overhead rule (a test passes one it advances itself).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        run_dir: Path,
        dist: DistContext,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        pipelined: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        check_resume_setting(config)
        self._clock = clock
        self.config = config
        self.root = run_dir / CHECKPOINTS
        self.dist = dist
        self.model = model
        self.optimizer = optimizer
        self.pipelined = pipelined
        self._sharded: Any = None  # the sharded back-end: torch.distributed.checkpoint, ~1 s to import
        if dist.enabled:
            from gputrain.checkpoint.sharded import ShardedSaver

            self._sharded = ShardedSaver(dist, config.async_save)
        self._background = AsyncSaver() if not dist.enabled and config.async_save else None
        self._started = clock()
        self._spent = 0.0  # seconds the loop has spent in saves
        self._last_cost = 0.0
        self._held: tuple[int, HostCopy] | None = None  # a best checkpoint put off, written with the next save

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def resume_point(self) -> tuple[Path | None, bool]:
        """(checkpoint to resume from or None, whether its bytes have been verified already).
        Collective when several ranks run: they verify the candidates together, each hashing its
        share of the files (checkpoint/by_rank.py), and all get the same answer."""
        resume = self.config.resume
        if resume == "never":
            return None, False
        # a run directory or a checkpoints folder given as checkpoint.resume means its latest checkpoint
        root = self.root if resume == "auto" else checkpoints_folder(Path(resume))
        if root is None:
            return Path(resume), False
        if self.dist.enabled:
            from gputrain.checkpoint.by_rank import find_resumable_together

            found = find_resumable_together(root, self.dist)
        else:
            found = find_resumable(root)
        if found is None and resume != "auto":  # its checkpoints went between the check and now
            check_resume_setting(self.config)
        return found, True

    def load(self, path: Path, verified: bool = False) -> CheckedCheckpoint:
        """Check the checkpoint at `path` against this job's model and optimizer and read its training
        state; return it with the loading of the weights and optimizer state pending: nothing is
        changed here. `restore_training_state` (state.py) checks the rest of the state against the
        scheduler, precision and RNGs, then applies it all, so a checkpoint that is not this run's
        leaves everything as it was. Collective when several ranks run.

        Raises:
            CheckpointMismatch: the checkpoint is not this run's (a UsageError: exit code 2).
            RunError: a damaged or hostile checkpoint.
        """
        try:
            if self.dist.enabled and not verified:  # together: no rank reads every file
                from gputrain.checkpoint.by_rank import verify_together

                verify_together(path, self.dist)
                verified = True
            # several ranks: by parameter name, whatever the format (their parameters may be sharded)
            saved, apply = read_checkpoint(
                path, self.model, self.optimizer, verified=verified, by_name=self.dist.enabled
            )
        except CorruptCheckpoint as err:
            raise RunError(f"cannot resume: {err}") from None

        def apply_weights() -> None:
            try:
                apply()
            except CorruptCheckpoint as err:
                raise RunError(f"cannot resume: {err}") from None
            except (KeyError, TypeError, ValueError, IndexError, RuntimeError, OSError) as err:
                raise RunError(
                    f"cannot resume: {path}: loading the weights failed after they were checked "
                    f"({type(err).__name__}: {str(err)[:160]})"
                ) from None

        return CheckedCheckpoint(saved, apply_weights=apply_weights, step=checkpoint_step(path))

    def save(
        self,
        step: int,
        state_of: Callable[[], dict[str, Any]],
        keep_step: int | None = None,
        *,
        periodic: bool = False,
    ) -> Path | None:
        """Save step `step` with `state_of()` (the loop's training state, asked for only when it is
        needed), then drop all but the last `keep_last` and `keep_step` (the best one). Collective
        when several ranks run. `periodic`: an every_epochs/every_steps save, which the overhead
        rule may put off (see the module docstring). Returns the checkpoint's final path (written
        in the background with async_save), or None when nothing was saved."""
        if not self.config.enabled:
            return None
        if periodic and self._puts_off():
            if keep_step == step:  # the new best: kept in host memory until the next save
                self._held = (step, HostCopy.of(self.model, self._one_process_state(state_of())))
            return None
        started = self._clock()
        path = self._write(step, state_of(), keep_step)
        self._last_cost = self._clock() - started
        self._spent += self._last_cost
        return path

    def _puts_off(self) -> bool:
        """Whether one more save now would take the time spent saving past `max_overhead`."""
        budget = self.config.max_overhead
        if budget <= 0 or self.dist.enabled:
            return False
        return self._spent + self._last_cost > budget * (self._clock() - self._started)

    def _one_process_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return {
            **state,
            "optimizer_kind": type(self.optimizer).__name__,  # named in a mismatch on resume
            "optimizer": self.optimizer.state_dict(),
            # parameter names, in the order the optimizer's state numbers them (group by group), let a
            # multi-rank job resume a one-process checkpoint
            "param_names": optimizer_param_names(self.model, self.optimizer),
        }

    def _write(self, step: int, state: dict[str, Any], keep_step: int | None) -> Path:
        keep = {keep_step} if self.config.keep_best and keep_step else set()

        def rotate(*_: Any) -> None:
            rotate_checkpoints(self.root, self.config.keep_last, keep)

        if self._sharded is not None:  # every rank writes its shards; rank 0 commits and rotates
            state = {**state, "optimizer_kind": type(self.optimizer).__name__}
            return self._sharded.save(self.root, step, self.model, self.optimizer, state, on_commit=rotate)
        held, self._held = self._held, None
        if held is not None and held[0] != step:  # the best that was put off goes first
            held_step, copy = held
            if self._background is not None:
                self._background.save_copy(self.root, held_step, copy)
            else:
                # the host copy stands in for the module: save_checkpoint reads only its state_dict()
                save_checkpoint(self.root, held_step, copy.weights, copy.state)  # type: ignore[arg-type]
        state = self._one_process_state(state)
        if self._background is not None:  # rotation runs once the background save has committed
            return self._background.save(self.root, step, self.model, state, after=rotate)
        path = save_checkpoint(self.root, step, self.model, state)
        rotate()
        return path

    def wait(self) -> None:
        """Until the save in flight (if any) is committed; its failure is raised here."""
        for saver in (self._sharded, self._background):
            if saver is not None:
                saver.wait()

    def save_final_weights(self, path: Path) -> None:
        """model.safetensors with the whole model (each rank writes its shards or stage in place)."""
        self.wait()
        if not self.dist.enabled:
            save_weights(self.model, path)
            return
        from gputrain.checkpoint.sharded import save_final_weights

        save_final_weights(path, self.model, self.dist, self.pipelined)


def optimizer_param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each parameter in the order of the optimizer's state dict: group by group (the
    weight-decay groups put matrices first), not the model's order."""
    name_of = {id(p): name for name, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]
