"""Load a run's weights into a freshly built model, checked before anything is applied.

The three places weights live, each read with the checkpoint package's own checks (names, shapes
and dtypes must be this model's; tied weights are stored once): the final `model.safetensors`, and a
checkpoint directory of either format (one-process, or sharded (DCP) from a multi-rank run), read by
`read_checkpoint` as resume reads it, the model's tensors alone (no optimizer state is loaded).
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from gputrain.checkpoint.io import CorruptCheckpoint, model_weights
from gputrain.checkpoint.matching import CheckpointMismatch
from gputrain.checkpoint.reader import read_checkpoint
from gputrain.errors import UsageError, first_line
from gputrain.run.layout import CHECKPOINT_WEIGHTS
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
        else:  # a checkpoint of either format, read as resume reads it; its optimizer state is not
            _, apply = read_checkpoint(path, model, verified=True)
            apply()
    except CheckpointMismatch as err:
        raise UsageError(_not_this_model(err)) from None
    except CorruptCheckpoint as err:
        raise UsageError(f"cannot load weights: {err}") from None


def _not_this_model(err: CheckpointMismatch) -> str:
    """The checkpoint checks' refusal in a `use` command's words: its message speaks of resuming,
    which training does; here weights are loaded into the run's model and nothing is resumed."""
    problem = err.problem
    if err.path.is_file():  # the checks name the checkpoint's weights file, which is this very file
        problem = problem.removeprefix(f"{CHECKPOINT_WEIGHTS}: ")
    return f"cannot load weights: {err.path}: {problem}"


def _load_file(path: Path, model: nn.Module) -> None:
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise UsageError(f"{path}: not a readable safetensors file ({first_line(err)})") from None
    # tied names absent from the file share the loaded tensor
    model.load_state_dict(model_weights(path, tensors, model), strict=False)
