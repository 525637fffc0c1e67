"""Checkpoints of a job with several ranks, in torch.distributed.checkpoint (DCP) format.

Every rank writes its own shards (FSDP/TP) in parallel; DCP records which slice of which tensor
each file holds, so a checkpoint loads onto any world size and strategy: saved from 2 FSDP ranks,
it resumes on 1 process or with DDP (read back by reader.py through by_name.py). Model and
optimizer state are keyed by parameter name (`get_state_dict`), never by position. The discipline
of io.py is kept: written under a temporary name, then rank 0 — after every rank has finished —
adds state.pt, the manifest of checksums and the COMMITTED marker, and renames it into place. Each
rank hashes the shards it wrote and rank 0 records their digests (by_rank.py), so no rank reads all
the shards at a save. With `async_save` the tensors are copied to host memory at once and written
in the background; the commit happens when the write has finished.

Checkpoints must go to a file system every rank sees (the run directory on shared storage).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor

from gputrain.checkpoint.by_rank import DigestingWriter
from gputrain.checkpoint.final_weights import save_sharded_weights
from gputrain.checkpoint.io import (
    CHECKPOINT_STATE,
    DCP_METADATA,
    checkpoint_name,
    commit_checkpoint_dir,
    save_weights,
)
from gputrain.distributed.context import DistContext


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / DCP_METADATA).is_file()


def holds_dtensors(model: nn.Module) -> bool:
    """True when parameters are sharded (FSDP) or split (TP): a plain state_dict would be partial."""
    return any(isinstance(p, DTensor) for p in model.parameters())


class ShardedSaver:
    """Saves and commits distributed checkpoints; at most one asynchronous save is in flight."""

    def __init__(self, ctx: DistContext, async_save: bool = False) -> None:
        self.ctx = ctx
        self.async_save = async_save
        self._pending: tuple[Future[Any], Callable[[], None]] | None = None
        self._gloo: dist.ProcessGroup | None = None

    def save(
        self,
        root: Path,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        on_commit: Callable[[], None] | None = None,
    ) -> Path:
        """Collective: every rank calls it at the same step. Returns the final path (committed at once,
        or when the background write ends with async_save)."""
        self.wait()  # never two writes in flight: the previous one's host copy would be overwritten
        final = root / checkpoint_name(step)
        tmp = root / f".{checkpoint_name(step)}.tmp"  # same name on every rank: they write into one directory
        if self.ctx.is_main:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        rngs: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(rngs, state["rng"])  # every rank's RNG, so each resumes its own stream
        state = {**state, "rng": rngs, "optimizer_groups": _groups_of_every_rank(optim_sd, self.ctx.world_size)}

        writer = DigestingWriter(tmp)  # each rank hashes its own shards; rank 0 gets the digests

        def commit() -> None:
            if self.ctx.is_main:
                _commit(tmp, final, step, state, writer.digests)
                if on_commit is not None:
                    on_commit()

        payload = {"model": model_sd, "optim": optim_sd}
        if self.async_save:
            if self._gloo is None:
                # the background write runs its own collectives: on the training group they would
                # interleave with the step's and mismatch; and it coordinates over CPU (gloo)
                self._gloo = dist.new_group(backend="gloo")
            future = dcp.async_save(payload, storage_writer=writer, process_group=self._gloo)
            assert isinstance(future, Future)  # the default stager copies before returning: an upload future
            self._pending = (future, commit)
        else:
            dcp.save(payload, storage_writer=writer)
            commit()
            dist.barrier()  # nobody resumes or exits before the commit is on disk
        return final

    def wait(self) -> None:
        """Finish the background save, if any, and commit it."""
        if self._pending is None:
            return
        future, commit = self._pending
        self._pending = None
        future.result()
        commit()


def _commit(tmp: Path, final: Path, step: int, state: dict[str, Any], digests: dict[str, Any]) -> None:
    """Rank 0, after every rank's shards are written: state.pt, then the shared commit protocol with
    the digests the ranks took of their own shards (anything unreported is hashed here)."""
    torch.save(state, tmp / CHECKPOINT_STATE)
    commit_checkpoint_dir(tmp, final, step, fmt="dcp", known=digests)


def _groups_of_every_rank(optim_sd: dict[str, Any], world_size: int) -> list[list[str]]:
    """Each parameter group's parameter names over all ranks. DCP keeps one rank's copy of a plain
    value such as `optim.param_groups.<i>.params`; under pipeline parallelism each rank lists only
    its own stage's parameters, so state.pt carries the whole list. Collective."""
    local = [list(group["params"]) for group in optim_sd["param_groups"]]
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, local)
    return [list(dict.fromkeys(name for lists in every for name in lists[i])) for i in range(len(local))]


def save_final_weights(path: Path, model: nn.Module, ctx: DistContext, pipeline: bool = False) -> None:
    """Write model.safetensors with the whole model. Sharded (FSDP/TP) or pipelined: every rank
    writes its own part in place (final_weights.py), none gathers the model; replicated (DDP):
    rank 0 writes its copy. Collective when the job has several ranks."""
    if not ctx.enabled or (not holds_dtensors(model) and not pipeline):
        if ctx.is_main:
            save_weights(model, path)
        return
    save_sharded_weights(path, model, ctx)
