"""The one way a checkpoint is read, for resume (train/checkpointer.py) and for the `use` commands
(use/weights.py): either format (one-process `model.safetensors` + `state.pt`, or DCP shards), onto
any layout (one process, or ranks holding shards or replicas), verified and checked before anything
is applied.

Nothing in a checkpoint can run code: weights are safetensors (raw tensors and a JSON header) or DCP
shards read through safe_dcp.py's allow-list, and the state is read with `weights_only=True`, which
refuses any pickled object other than tensors and plain containers. Everything is read and checked
against the model (and the optimizer) first, so a refused checkpoint leaves them untouched.

Two ways of matching saved tensors to live ones:
- by position: a one-process checkpoint onto one process; the weights by their state dict's names,
  the optimizer's state as saved (`load_state_dict`, bit for bit);
- by parameter name (checkpoint/by_name.py): a sharded checkpoint, or any checkpoint onto a job of
  several ranks; torch.distributed.checkpoint's state dicts shard and gather it as this job holds
  its parameters. Imported only then: DCP takes ~1 s to import.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gputrain.checkpoint.io import (
    CHECKPOINT_STATE,
    DCP_METADATA,
    model_weights,
    read_state,
    read_weights,
    verify_checkpoint,
)
from gputrain.checkpoint.matching import (
    CheckpointMismatch,
    check_optimizer,
    live_params,
    names_by_tensor,
    positional_optimizer,
)


def read_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    verified: bool = False,
    by_name: bool = False,
) -> tuple[dict[str, Any], Callable[[], None]]:
    """Verify the checkpoint at `path`, read its training state and check its weights (and, with an
    `optimizer`, the optimizer's state) against this job's; return the training state and the
    function that loads them. Nothing changes before that function is called.

    Args:
        optimizer: None: the weights alone (the `use` commands); the optimizer's state is not checked.
        verified: every byte has been checked already (find_resumable, choose_weights): hashing
            twice doubles the I/O.
        by_name: match by parameter name even for a one-process checkpoint: the job has several
            ranks (its parameters may be sharded or split). Collective then: every rank calls it.
            A sharded checkpoint is always matched by name.

    Raises:
        CorruptCheckpoint: a damaged or hostile file, naming it.
        CheckpointMismatch: an intact checkpoint that is not this run's (exit code 2).
    """
    if not verified:
        verify_checkpoint(path)
    state = read_state(path)
    if by_name or (path / DCP_METADATA).is_file():
        from gputrain.checkpoint.by_name import prepare_by_name

        return state, prepare_by_name(path, state, model, optimizer)
    return state, _prepare_by_position(path, state, model, optimizer)


def _prepare_by_position(
    path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> Callable[[], None]:
    """A one-process checkpoint onto one process: the weights checked by name, shape and dtype, the
    optimizer's state by position (the order of its parameter groups)."""
    weights = model_weights(path, read_weights(path), model)
    if optimizer is None:
        return lambda: _load_weights(model, weights)
    if "optimizer" not in state:
        raise CheckpointMismatch(path, f"{CHECKPOINT_STATE} holds no optimizer state")
    saved = positional_optimizer(path, state["optimizer"], state.get("optimizer_kind"))

    def key_of(group: int, index: int, _name: str) -> Any:
        ids = saved.params[group] if group < len(saved.params) else []
        return ids[index] if index < len(ids) else None

    live = live_params(optimizer, names_by_tensor(model), key_of)
    check_optimizer(path, optimizer, saved, live, positional=True)

    def apply() -> None:
        _load_weights(model, weights)
        optimizer.load_state_dict(state["optimizer"])

    return apply


def _load_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    model.load_state_dict(weights, strict=False)  # tied names absent from the file share the loaded tensor
