"""`Trainer.validate()` and `Trainer.test()`: one evaluation of a split on its own, outside `fit`,
with the current weights or a checkpoint's.

A checkpoint is named as `gputrain evaluate --checkpoint` names one (use/run_dir.py's
`choose_weights`): "final", "best" or "last" of the Trainer's run directory, or a path (a
checkpoint directory step-N, a `.safetensors` file, or a run directory, whose final weights are
meant). Its weights alone are loaded into the model, checked first (names, shapes, dtypes), and
stay there, as Lightning's `trainer.validate(ckpt_path=...)` leaves them; the optimizer and the
loop are not touched. The evaluation writes no file (no row in metrics.jsonl, no summary): it is a
reading of the model, not a part of the run's record; its metrics are returned and shown on the
console.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from gputrain.checkpoint.io import CorruptCheckpoint
from gputrain.checkpoint.matching import CheckpointMismatch
from gputrain.checkpoint.reader import read_checkpoint
from gputrain.distributed.context import DistContext
from gputrain.errors import UsageError

if TYPE_CHECKING:
    from gputrain.use.run_dir import WeightsSource


def load_checkpoint_weights(checkpoint: str | Path, run_dir: Path, model: nn.Module, dist: DistContext) -> str:
    """Load the weights `checkpoint` names into `model` (module docstring); returns what was loaded,
    in words. Several ranks read a checkpoint by parameter name, each into its own shards.

    Raises:
        UsageError: no such weights, or they are not this model's (naming the path and the first
            parameter that differs).
    """
    from gputrain.use.run_dir import choose_weights  # the `use` commands' resolution of a choice
    from gputrain.use.weights import load_weights

    source: WeightsSource = choose_weights(run_dir, str(checkpoint))
    if source.path.is_file() or not dist.enabled:
        load_weights(source, model)
        return source.describe()
    try:  # a checkpoint directory onto sharded or replicated ranks
        _, apply = read_checkpoint(source.path, model, verified=True, by_name=True)
        apply()
    except (CheckpointMismatch, CorruptCheckpoint) as err:
        raise UsageError(f"cannot load weights: {err}") from None
    return source.describe()
