"""Checkpoints of a job with several ranks, in torch.distributed.checkpoint (DCP) format.

Every rank writes its own shards (FSDP/TP) in parallel; DCP records which slice of which tensor
each file holds, so a checkpoint loads onto any world size and strategy: saved from 2 FSDP ranks,
it resumes on 1 process or with DDP. Model and optimizer state are keyed by parameter name
(`get_state_dict`), never by position. The discipline of io.py is kept: written under a temporary
name, then rank 0 — after every rank has finished — adds state.pt, the manifest of checksums and
the COMMITTED marker, and renames it into place. With `async_save` the tensors are copied to host
memory at once and written in the background; the commit happens when the write has finished.

Checkpoints must go to a file system every rank sees (the run directory on shared storage).
"""

from __future__ import annotations

import pickle
import shutil
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from gputrain.checkpoint.io import (
    MODEL_FILE,
    STATE_FILE,
    CorruptCheckpoint,
    commit_checkpoint_dir,
    save_weights,
    step_dir_name,
    verify_checkpoint,
)
from gputrain.checkpoint.safe_dcp import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointContent,
)
from gputrain.distributed.context import DistContext
from gputrain.errors import RunError

DCP_METADATA = ".metadata"


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
        final = root / step_dir_name(step)
        tmp = root / f".{step_dir_name(step)}.tmp"  # same name on every rank: they write into one directory
        if self.ctx.is_main:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        dist.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        rngs: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(rngs, state["rng"])  # every rank's RNG, so each resumes its own stream
        state = {**state, "rng": rngs}

        def commit() -> None:
            if self.ctx.is_main:
                _commit(tmp, final, step, state)
                if on_commit is not None:
                    on_commit()

        payload = {"model": model_sd, "optim": optim_sd}
        if self.async_save:
            if self._gloo is None:
                # the background write runs its own collectives: on the training group they would
                # interleave with the step's and mismatch; and it coordinates over CPU (gloo)
                self._gloo = dist.new_group(backend="gloo")
            future = dcp.async_save(payload, checkpoint_id=str(tmp), process_group=self._gloo)
            self._pending = (future, commit)  # type: ignore[assignment]
        else:
            dcp.save(payload, checkpoint_id=str(tmp))
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


def _commit(tmp: Path, final: Path, step: int, state: dict[str, Any]) -> None:
    """Rank 0, after every rank's shards are written: state.pt, then the shared commit protocol."""
    torch.save(state, tmp / STATE_FILE)
    commit_checkpoint_dir(tmp, final, step, fmt="dcp")


def load_portable_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, verified: bool = False
) -> dict[str, Any]:
    """Load model and optimizer state from either format onto this job's layout; return the rest of
    the training state. Works on one process or many, whatever the strategy saved or loads."""
    if not verified:  # see load_checkpoint
        verify_checkpoint(path)
    if is_sharded_checkpoint(path):
        model_sd, optim_sd = get_state_dict(model, optimizer)
        payload: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        # reads just the slices this rank holds; on one process, all of them
        with warnings.catch_warnings():  # DCP warns that one process is one process
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            reader = SafeFileSystemReader(str(path))  # never DCP's own: it unpickles without limits
            try:
                dcp.load(payload, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=not dist.is_initialized())
            except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
                refusal = reader.refusal or (err if isinstance(err, UnsafeCheckpointContent) else None)
                if refusal is None:
                    raise
                raise CorruptCheckpoint(f"{path}: {refusal}; refused to load it (it could run code)") from None
        set_state_dict(model, optimizer, model_state_dict=payload["model"], optim_state_dict=payload["optim"])
    else:
        _load_single_process_checkpoint(path, model, optimizer)
    try:
        return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CorruptCheckpoint(
            f"{path}: {STATE_FILE} holds objects other than tensors and plain values; "
            "refused to load it (it could run code)"
        ) from None


def _load_single_process_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A one-process checkpoint (model.safetensors + state.pt) onto a sharded or replicated job."""
    from safetensors.torch import load_file

    saved = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    names = saved.get("param_names")
    if names is None:
        raise RunError(
            f"checkpoint {path} predates multi-rank resume (no param_names); resume it on one "
            "process, or start over with checkpoint.resume=never"
        )
    full = load_file(str(path / MODEL_FILE))
    options = StateDictOptions(full_state_dict=True, strict=False)
    expected = set(get_model_state_dict(model).keys())
    missing = expected - set(full)
    if missing:
        raise RunError(f"checkpoint {path} does not fit this model: missing {sorted(missing)[:3]}")
    set_model_state_dict(model, {k: v for k, v in full.items() if k in expected}, options=options)
    # the optimizer state was saved by position; name it so it can be sharded like the parameters
    osd = saved["optimizer"]
    named: dict[str, Any] = {
        "state": {names[i]: s for i, s in osd["state"].items() if names[i] in expected},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"] if names[i] in expected]} for g in osd["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, named, options=options)


def full_model_state_dict(model: nn.Module, ctx: DistContext, pipeline: bool = False) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on rank 0 (None elsewhere), gathered from shards and pipeline stages.
    Collective when the job has several ranks."""
    if not ctx.enabled:
        return model.state_dict()
    if not holds_dtensors(model) and not pipeline:
        return model.state_dict() if ctx.is_main else None
    options = StateDictOptions(full_state_dict=True, cpu_offload=not pipeline)
    full = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    if pipeline:  # each stage holds different layers: collect them all on rank 0
        parts: list[Any] = [None] * ctx.world_size if ctx.is_main else []
        mine = {k: v.detach().cpu() for k, v in full.items()}
        dist.gather_object(mine, parts if ctx.is_main else None, dst=0)
        if not ctx.is_main:
            return None
        full = {k: v for part in parts for k, v in part.items()}
    if not ctx.is_main:
        return None
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for key, value in full.items():  # tied weights: safetensors refuses two names for one storage
        ptr = value.untyped_storage().data_ptr()
        out[key] = value.clone() if ptr in seen else value.contiguous()
        seen.add(ptr)
    return out


def save_final_weights(path: Path, model: nn.Module, ctx: DistContext, pipeline: bool = False) -> None:
    """Write model.safetensors with the full weights (collective when sharded; rank 0 writes)."""
    if not ctx.enabled or (not holds_dtensors(model) and not pipeline):
        if ctx.is_main:
            save_weights(model, path)
        return
    weights = full_model_state_dict(model, ctx, pipeline)
    if weights is not None:
        save_weights(weights, path)
