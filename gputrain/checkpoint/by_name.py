"""Reading a checkpoint by parameter name onto any layout: the half of `read_checkpoint`
(reader.py) a sharded (DCP) checkpoint, or a job of several ranks, needs.

torch.distributed.checkpoint's state dicts key model and optimizer state by parameter name and shard
or gather them as this job holds its parameters, so a checkpoint saved from 2 FSDP ranks loads on 1
process or with DDP, and a one-process checkpoint onto sharded ranks. Everything is checked before
anything is loaded: the weights' names, global shapes and dtypes (a DCP checkpoint's from its
.metadata, read through the allow-list of safe_dcp.py) and the optimizer's settings and state.
Every rank reaches the same verdict: a problem found on one is raised on all.
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

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

from gputrain.checkpoint.io import DCP_METADATA, CorruptCheckpoint, read_weights
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
from gputrain.run.layout import CHECKPOINT_STATE, CHECKPOINT_WEIGHTS


def prepare_by_name(
    path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> Callable[[], None]:
    """Check a verified checkpoint of either format (`state`: its state.pt) against this job's model
    and optimizer (None: the weights alone) by name and global shape; return the function that loads
    them (collective when several ranks run). Nothing changes before it is called.

    Raises:
        CorruptCheckpoint: a hostile .metadata or DCP item.
        CheckpointMismatch: the checkpoint is not this model's, on every rank if on any.
    """
    problem: str | None = None
    try:
        if (path / DCP_METADATA).is_file():
            apply = _prepare_sharded(path, state, model, optimizer)
        else:
            apply = _prepare_single_process(path, state, model, optimizer)
    except CheckpointMismatch as err:
        problem, apply = err.problem, _nothing
    _agree(path, problem)
    return apply


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
    path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> Callable[[], None]:
    """A one-process checkpoint (model.safetensors + state.pt) onto a sharded or replicated job."""
    model_sd, expected, known = _model_specs(model)  # collective first: every rank gets here
    names = _param_names(path, state) if optimizer is not None else []
    full = {canonical_name(k): v for k, v in read_weights(path).items()}
    ties = tied_groups(model, canonical=True)
    check_weights(path, CHECKPOINT_WEIGHTS, {k: Spec.of(v) for k, v in full.items()}, expected, ties, known)
    if optimizer is not None:
        _check_named_optimizer(path, state, names, model, optimizer)

    def apply() -> None:
        weights = dict(full)
        for group in ties:  # one name of a tied group is in the file; the state dict names them all
            present = next((n for n in sorted(group) if n in full), None)
            for name in group:
                if name not in weights and present is not None:
                    weights[name] = full[present]
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, {k: v for k, v in weights.items() if k in model_sd}, options=options)
        if optimizer is None:
            return
        osd = state["optimizer"]
        loaded: dict[str, Any] = {
            "state": {names[i]: s for i, s in osd["state"].items() if names[i] in model_sd},
            "param_groups": [
                {**g, "params": [names[i] for i in g["params"] if names[i] in model_sd]} for g in osd["param_groups"]
            ],
        }
        set_optimizer_state_dict(model, optimizer, loaded, options=options)

    return apply


def _param_names(path: Path, state: dict[str, Any]) -> list[str]:
    """state.pt's `param_names` (canonical): the name of each parameter the optimizer state numbers."""
    names = state.get("param_names")
    if names is None:
        raise CheckpointMismatch(
            path,
            f"{CHECKPOINT_STATE} predates multi-rank resume (no param_names); resume it on one process, "
            "or start over with checkpoint.resume=never",
        )
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointMismatch(
            path, f"{CHECKPOINT_STATE}: param_names is {kind_of_value(names)}, not a list of names"
        )
    return [canonical_name(n) for n in names]  # saved from the module as it ran (compiled: `_orig_mod.`)


def _check_named_optimizer(
    path: Path, state: dict[str, Any], names: list[str], model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """A one-process checkpoint's optimizer state, saved by position, checked by name against this job's."""
    if "optimizer" not in state:
        raise CheckpointMismatch(path, f"{CHECKPOINT_STATE} holds no optimizer state")
    positional = positional_optimizer(path, state["optimizer"], state.get("optimizer_kind"))
    count = sum(len(ids) for ids in positional.params)
    if any(not 0 <= i < len(names) for ids in positional.params for i in ids) or count != len(names):
        raise CheckpointMismatch(
            path, f"{CHECKPOINT_STATE}: param_names names {len(names)} parameters, the optimizer state holds {count}"
        )
    # the optimizer state was saved by position; name it so it can be sharded like the parameters
    named = SavedOptimizer(
        positional.groups,
        [[names[i] for i in ids] for ids in positional.params],
        {names[i]: entry for i, entry in positional.state.items() if isinstance(i, int) and 0 <= i < len(names)},
        positional.kind,
    )
    check_optimizer(path, optimizer, named, _live(model, optimizer), positional=False)


def _prepare_sharded(
    path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None
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
    if optimizer is not None:
        check_optimizer(
            path,
            optimizer,
            _sharded_optimizer(
                path, items, _ItemReader(path, metadata), state.get("optimizer_kind"), state.get("optimizer_groups")
            ),
            _live(model, optimizer),
            positional=False,
            live_layout_needed=True,  # DCP loads into the state an initialised optimizer holds
        )

    def apply() -> None:
        payload: dict[str, Any]
        if optimizer is None:  # the weights alone: the optimizer's items are not read
            payload = {"model": get_model_state_dict(model)}
        else:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            payload = {"model": model_sd, "optim": optim_sd}
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
        if optimizer is None:
            set_model_state_dict(model, payload["model"])
        else:
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
