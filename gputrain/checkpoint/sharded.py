"""Checkpoints of a job with several ranks, in torch.distributed.checkpoint (DCP) format.

Every rank writes its own shards (FSDP/TP) in parallel; DCP records which slice of which tensor
each file holds, so a checkpoint loads onto any world size and strategy: saved from 2 FSDP ranks,
it resumes on 1 process or with DDP. Model and optimizer state are keyed by parameter name
(`get_state_dict`), never by position. The discipline of io.py is kept: written under a temporary
name, then rank 0 — after every rank has finished — adds state.pt, the manifest of checksums and
the COMMITTED marker, and renames it into place. Each rank hashes the shards it wrote and rank 0
records their digests (by_rank.py), so no rank reads all the shards at a save. With `async_save`
the tensors are copied to host memory at once and written in the background; the commit happens
when the write has finished.

Checkpoints must go to a file system every rank sees (the run directory on shared storage).
"""

from __future__ import annotations

import io
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
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from gputrain.checkpoint.by_rank import DigestingWriter
from gputrain.checkpoint.io import (
    DCP_METADATA,
    MODEL_FILE,
    STATE_FILE,
    CorruptCheckpoint,
    commit_checkpoint_dir,
    read_state,
    read_weights,
    save_weights,
    step_dir_name,
    verify_checkpoint,
)
from gputrain.checkpoint.matching import (
    CheckpointMismatch,
    LiveParam,
    SavedItem,
    SavedOptimizer,
    Spec,
    canonical_name,
    check_optimizer,
    check_weights,
    kind_of_value,
    live_params,
    names_by_tensor,
    positional_optimizer,
    tied_groups,
)
from gputrain.checkpoint.safe_dcp import (
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointContent,
    read_metadata,
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
    torch.save(state, tmp / STATE_FILE)
    commit_checkpoint_dir(tmp, final, step, fmt="dcp", known=digests)


def load_portable_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, verified: bool = False
) -> dict[str, Any]:
    """Load model and optimizer state from either format onto this job's layout; return the rest of
    the training state. Works on one process or many, whatever the strategy saved or loads.
    Collective when several ranks run. Everything is checked before anything is loaded.

    Raises:
        CorruptCheckpoint: a damaged or hostile file.
        CheckpointMismatch: the checkpoint is not this run's (nothing was changed).
    """
    state, apply = prepare_portable_load(path, model, optimizer, verified=verified)
    apply()
    return state


def prepare_portable_load(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, verified: bool = False
) -> tuple[dict[str, Any], Callable[[], None]]:
    """Verify a checkpoint of either format, read its training state and check its weights and
    optimizer state against this job's model and optimizer (by name, global shapes); return the
    training state and the function that loads the weights and optimizer state (collective when
    several ranks run). Every rank reaches the same verdict: a problem found on one is raised on all.
    Nothing of the model or optimizer changes before the function is called."""
    if not verified:  # see load_checkpoint
        verify_checkpoint(path)
    state = read_state(path)
    problem: str | None = None
    try:
        if is_sharded_checkpoint(path):
            apply = _prepare_sharded(path, state, model, optimizer)
        else:
            apply = _prepare_single_process(path, state, model, optimizer)
    except CheckpointMismatch as err:
        problem, apply = err.problem, _nothing
    _agree(path, problem)
    return state, apply


def _nothing() -> None:
    return None


def _ranks() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _agree(path: Path, problem: str | None) -> None:
    """Raise CheckpointMismatch on every rank if any rank found a problem (the lowest rank's)."""
    if _ranks() > 1:
        found: list[Any] = [None] * _ranks()
        dist.all_gather_object(found, problem)
        problem = next((p for p in found if p), None)
    if problem:
        raise CheckpointMismatch(path, problem)


def _all_names(names: set[str]) -> set[str]:
    """The union over ranks of `names` (a pipeline stage holds only its own layers)."""
    if _ranks() == 1:
        return names
    found: list[Any] = [None] * _ranks()
    dist.all_gather_object(found, sorted(names))
    return {name for part in found for name in part}


def _model_specs(model: nn.Module) -> tuple[dict[str, Any], dict[str, Spec], set[str]]:
    """This rank's model state dict by canonical name, its specs (global shapes), every rank's names.
    Collective when several ranks run."""
    model_sd = get_model_state_dict(model)
    expected = {name: Spec.of(t) for name, t in model_sd.items() if isinstance(t, torch.Tensor)}
    return model_sd, expected, _all_names(set(expected))


def _live(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[LiveParam]:
    return live_params(optimizer, names_by_tensor(model, canonical=True), lambda _g, _j, name: name)


def _prepare_single_process(
    path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
) -> Callable[[], None]:
    """A one-process checkpoint (model.safetensors + state.pt) onto a sharded or replicated job."""
    model_sd, expected, known = _model_specs(model)  # collective first: every rank gets here
    names = state.get("param_names")
    if names is None:
        raise CheckpointMismatch(
            path,
            f"{STATE_FILE} predates multi-rank resume (no param_names); resume it on one process, "
            "or start over with checkpoint.resume=never",
        )
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointMismatch(path, f"{STATE_FILE}: param_names is {kind_of_value(names)}, not a list of names")
    names = [canonical_name(n) for n in names]  # saved from the module as it ran (compiled: `_orig_mod.`)
    full = {canonical_name(k): v for k, v in read_weights(path).items()}
    ties = tied_groups(model, canonical=True)
    check_weights(path, MODEL_FILE, {k: Spec.of(v) for k, v in full.items()}, expected, ties, known)
    if "optimizer" not in state:
        raise CheckpointMismatch(path, f"{STATE_FILE} holds no optimizer state")
    positional = positional_optimizer(path, state["optimizer"], state.get("optimizer_kind"))
    count = sum(len(ids) for ids in positional.params)
    if any(not 0 <= i < len(names) for ids in positional.params for i in ids) or count != len(names):
        raise CheckpointMismatch(
            path, f"{STATE_FILE}: param_names names {len(names)} parameters, the optimizer state holds {count}"
        )
    # the optimizer state was saved by position; name it so it can be sharded like the parameters
    named = SavedOptimizer(
        positional.groups,
        [[names[i] for i in ids] for ids in positional.params],
        {names[i]: entry for i, entry in positional.state.items() if isinstance(i, int) and 0 <= i < len(names)},
        positional.kind,
    )
    check_optimizer(path, optimizer, named, _live(model, optimizer), positional=False)

    def apply() -> None:
        weights = dict(full)
        for group in ties:  # one name of a tied group is in the file; the state dict names them all
            present = next((n for n in sorted(group) if n in full), None)
            for name in group:
                if name not in weights and present is not None:
                    weights[name] = full[present]
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, {k: v for k, v in weights.items() if k in model_sd}, options=options)
        osd = state["optimizer"]
        loaded: dict[str, Any] = {
            "state": {names[i]: s for i, s in osd["state"].items() if names[i] in model_sd},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"] if names[i] in model_sd]} for g in osd["param_groups"]
            ],
        }
        set_optimizer_state_dict(model, optimizer, loaded, options=options)

    return apply


def _prepare_sharded(
    path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer
) -> Callable[[], None]:
    """A sharded (DCP) checkpoint: its .metadata (every item's name, global shape and dtype) and its
    small non-tensor items (optimizer settings) are checked before any tensor is read."""
    _, expected, known = _model_specs(model)  # collective first: every rank gets here
    try:
        metadata = read_metadata(path / DCP_METADATA)
    except UnsafeCheckpointContent as err:
        raise CorruptCheckpoint(f"{path}: {err}; refused to load it (it could run code)") from None
    items = metadata.state_dict_metadata
    saved: dict[str, Spec] = {}
    for key, item in items.items():
        if key.startswith("model."):
            if not isinstance(item, TensorStorageMetadata):
                raise CheckpointMismatch(path, f"{DCP_METADATA}: {key[6:]} is not a tensor")
            saved[key[6:]] = Spec(tuple(int(n) for n in item.size), item.properties.dtype)
    check_weights(path, DCP_METADATA, saved, expected, tied_groups(model, canonical=True), known)
    reader = _ItemReader(path, metadata)
    check_optimizer(
        path,
        optimizer,
        _sharded_optimizer(path, items, reader, state.get("optimizer_kind"), state.get("optimizer_groups")),
        _live(model, optimizer),
        positional=False,
        live_layout_needed=True,  # DCP loads into the state an initialised optimizer holds
    )

    def apply() -> None:
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

    return apply


class _ItemReader:
    """Reads one non-tensor item of a DCP checkpoint (weights_only=True), by its flattened name."""

    def __init__(self, path: Path, metadata: Metadata) -> None:
        self.path = path
        self.where = {index.fqn: info for index, info in (metadata.storage_data or {}).items()}

    def read(self, fqn: str) -> Any:
        info = self.where.get(fqn)
        name = getattr(info, "relative_path", None)
        if info is None or getattr(info, "transform_descriptors", None) or not isinstance(name, str):
            return None  # stored in a way read only by DCP itself: not checked here
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise CorruptCheckpoint(f"{self.path}: {DCP_METADATA} refers to {name!r}, a path outside the checkpoint")
        try:
            with open(self.path / name, "rb") as f:
                f.seek(int(info.offset))
                data = f.read(int(info.length))
            return torch.load(io.BytesIO(data), weights_only=True)
        except pickle.UnpicklingError:
            raise CorruptCheckpoint(
                f"{self.path}: a DCP item ({fqn}) holds objects other than tensors and plain values; "
                "refused to load it (it could run code)"
            ) from None
        except (OSError, RuntimeError, EOFError, ValueError) as err:
            raise CorruptCheckpoint(f"{self.path}: a DCP item ({fqn}) is unreadable ({type(err).__name__})") from None


def _groups_of_every_rank(optim_sd: dict[str, Any], world_size: int) -> list[list[str]]:
    """Each parameter group's parameter names over all ranks. DCP keeps one rank's copy of a plain
    value such as `optim.param_groups.<i>.params`; under pipeline parallelism each rank lists only
    its own stage's parameters, so state.pt carries the whole list. Collective."""
    local = [list(group["params"]) for group in optim_sd["param_groups"]]
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, local)
    return [list(dict.fromkeys(name for lists in every for name in lists[i])) for i in range(len(local))]


def _sharded_optimizer(
    path: Path, items: dict[str, Any], reader: _ItemReader, kind: Any, every_rank: Any = None
) -> SavedOptimizer:
    """The optimizer part of a DCP checkpoint's metadata: `optim.param_groups.<i>.<setting>` and
    `optim.state.<parameter>.<key>` (settings and non-tensor state read from their files). Which
    group holds which parameter comes from state.pt's `optimizer_groups` (every rank's) where the
    checkpoint has it, else from the metadata (one rank's list)."""
    groups: dict[int, dict[str, Any]] = {}
    state: dict[Any, dict[str, SavedItem]] = {}
    for key, item in items.items():
        if key.startswith("optim.param_groups."):
            index, _, setting = key[len("optim.param_groups.") :].partition(".")
            if not index.isdigit() or not setting:
                raise CheckpointMismatch(path, f"{DCP_METADATA}: {key} is not an optimizer setting")
            if isinstance(item, TensorStorageMetadata):
                value: Any = torch.zeros(tuple(int(n) for n in item.size))
            else:
                value = reader.read(key)
            groups.setdefault(int(index), {})[setting] = value
        elif key.startswith("optim.state."):
            param, _, entry = key[len("optim.state.") :].rpartition(".")
            if not param or not entry:
                raise CheckpointMismatch(path, f"{DCP_METADATA}: {key} is not an optimizer state")
            if isinstance(item, TensorStorageMetadata):
                saved_item = SavedItem(tuple(int(n) for n in item.size))
            else:
                saved_item = SavedItem(None, reader.read(key))
            state.setdefault(param, {})[entry] = saved_item
    if sorted(groups) != list(range(len(groups))):
        raise CheckpointMismatch(path, f"{DCP_METADATA}: the optimizer's parameter groups are not numbered 0..n-1")
    params = []
    known = True
    whole = (
        every_rank
        if isinstance(every_rank, list)
        and len(every_rank) == len(groups)
        and all(isinstance(g, list) for g in every_rank)
        else None
    )
    for i in range(len(groups)):
        names = groups[i].pop("params", None)
        if whole is not None:
            names = whole[i]
        if names is None:  # stored in a way only DCP reads: which group holds what is not checked
            known, names = False, []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CheckpointMismatch(path, f"the optimizer's parameter group {i} does not list its parameters by name")
        params.append(names)
    return SavedOptimizer(
        [groups[i] for i in range(len(groups))], params, state, kind if isinstance(kind, str) else None, known
    )


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
