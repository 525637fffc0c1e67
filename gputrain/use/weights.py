"""Load a run's weights into a freshly built model, checked before anything is applied.

The three places weights live, each read with the checkpoint package's own readers and checks
(names, shapes and dtypes must be this model's; tied weights are stored once): the final
`model.safetensors`, a one-process checkpoint directory, and a sharded (DCP) checkpoint of a
multi-rank run, of which only the model's tensors are read (no optimizer state is loaded).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from gputrain.checkpoint.io import DCP_METADATA, MODEL_FILE, CorruptCheckpoint, load_checkpoint, model_weights
from gputrain.checkpoint.matching import CheckpointMismatch, Spec, canonical_name, check_weights, tied_groups
from gputrain.checkpoint.safe_dcp import SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpointContent, read_metadata
from gputrain.errors import UsageError, first_line
from gputrain.use.run_dir import WeightsSource


def load_weights(source: WeightsSource, model: nn.Module) -> None:
    """Load `source` into `model` (checkpoints are verified by `choose_weights` already).

    Raises:
        UsageError: the file is not readable weights, or they are not this model's (`cannot load
            weights: PATH: ...`, naming the first parameter that differs).
    """
    path = source.path
    try:
        if path.is_file():
            _load_file(path, model)
        elif (path / DCP_METADATA).is_file():
            _load_sharded(path, model)
        else:
            load_checkpoint(path, model, verified=True)
    except CheckpointMismatch as err:
        raise UsageError(_not_this_model(err)) from None
    except CorruptCheckpoint as err:
        raise UsageError(f"cannot load weights: {err}") from None


def _not_this_model(err: CheckpointMismatch) -> str:
    """The checkpoint checks' refusal in a `use` command's words: its message speaks of resuming,
    which training does; here weights are loaded into the run's model and nothing is resumed."""
    problem = err.problem
    if err.path.is_file():  # the checks name the checkpoint's weights file, which is this very file
        problem = problem.removeprefix(f"{MODEL_FILE}: ")
    return f"cannot load weights: {err.path}: {problem}"


def _load_file(path: Path, model: nn.Module) -> None:
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise UsageError(f"{path}: not a readable safetensors file ({first_line(err)})") from None
    # tied names absent from the file share the loaded tensor
    model.load_state_dict(model_weights(path, tensors, model), strict=False)


def _load_sharded(path: Path, model: nn.Module) -> None:
    """The model's tensors of a DCP checkpoint, whatever world size and strategy saved them."""
    try:
        metadata = read_metadata(path / DCP_METADATA)
    except UnsafeCheckpointContent as err:
        raise CorruptCheckpoint(f"{path}: {err}; refused to load it (it could run code)") from None
    saved = {
        key.removeprefix("model."): Spec(tuple(int(n) for n in item.size), item.properties.dtype)
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }
    expected = {canonical_name(name): Spec.of(t) for name, t in model.state_dict().items()}
    check_weights(path, DCP_METADATA, saved, expected, tied_groups(model, canonical=True))
    state = get_model_state_dict(model)
    with warnings.catch_warnings():  # DCP warns that one process is one process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(
            {"model": state},
            storage_reader=SafeFileSystemReader(str(path)),  # never DCP's own reader: it unpickles without limits
            planner=SafeLoadPlanner(),
            no_dist=not dist.is_initialized(),
        )
    set_model_state_dict(model, state)
