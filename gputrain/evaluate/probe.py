"""The model run once on the first samples of the data, before training: what the task is, and
whether the model takes these inputs at all.

The outputs are computed on the meta device first (shapes and dtypes only: no memory, no compute);
where an op has no meta kernel, the real model runs once in eval mode on two samples. An error the
model raises there is the model's own, and is reported as such (`ModelFailed`), with where in its
code it was raised.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Mapping, Sized
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_collate

from gputrain.data.feed import to_device
from gputrain.errors import first_line

_OWN_DIRS = (str(Path(torch.__file__).parent), str(Path(__file__).parents[1]))
"""torch's and gputrain's code: a frame there is not where the user's model or function went wrong."""


class ModelFailed(Exception):
    """The model raised on the data's first samples (not on the meta device: on real tensors)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {first_line(error)}{raised_at(error)}")
        self.error = error


def raised_at(error: BaseException) -> str:
    """' (at transformers/models/gpt2/modeling_gpt2.py:864 in forward)': the innermost frame of the
    traceback outside torch and gputrain (the model's or the user's line that called the failing
    op), or '' where there is none."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(_OWN_DIRS)]
    if not frames:
        return ""
    frame = frames[-1]
    path = frame.filename
    for root in sorted((p for p in sys.path if p and path.startswith(p + "/")), key=len, reverse=True)[:1]:
        path = path[len(root) + 1 :]  # relative to the import root: transformers/models/gpt2/...
    return f" (at {path}:{frame.lineno} in {frame.name})"


def first_batch(data: Any) -> Any:
    """Up to two samples of `data` collated as a loader would, or the loader's first batch; None
    where neither can be had."""
    dataset = data.dataset if isinstance(data, DataLoader) else data
    try:
        return default_collate([dataset[i] for i in range(min(2, len(cast(Sized, dataset))))])
    except Exception:  # noqa: BLE001 - not an indexable data set of collatable samples
        pass
    if isinstance(data, DataLoader):
        try:
            return next(iter(data))
        except Exception:  # noqa: BLE001
            return None
    return None


def as_pair(batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A batch as (inputs, targets), or None for any other structure."""
    if isinstance(batch, (list, tuple)) and len(batch) >= 2 and all(isinstance(t, torch.Tensor) for t in batch[:2]):
        return batch[0], batch[1]
    return None


def describe_batch(batch: Any) -> str:
    """A batch's structure in a few words: '(inputs, targets) tensors', 'dicts with keys a, b'."""
    if isinstance(batch, Mapping):
        return "dicts with keys " + ", ".join(map(str, batch))
    if as_pair(batch) is not None and len(batch) == 2:
        return "(inputs, targets) tensors"
    if isinstance(batch, (list, tuple)):
        return f"{type(batch).__name__}s of {len(batch)}"
    return type(batch).__name__


def run_model(model: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None) -> Any:
    """`model(*args, **kwargs)` without gradients: on the meta device where every op can run there,
    else for real, in eval mode (no BatchNorm statistics move, no dropout) where the model's
    parameters are, its mode restored afterwards.

    Raises:
        ModelFailed: the model raised on the real inputs.
    """
    kwargs = dict(kwargs or {})
    meta = {name: torch.empty_like(t, device="meta") for name, t in [*model.named_parameters(), *model.named_buffers()]}
    try:
        with torch.no_grad():
            on_meta = torch.device("meta")
            return torch.func.functional_call(model, meta, to_device(args, on_meta), to_device(kwargs, on_meta))
    except Exception:  # noqa: BLE001 - an op without a meta kernel: run the real model once instead
        pass
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(*to_device(args, device), **to_device(kwargs, device))
    except Exception as err:  # the model's own error: the caller reports it
        raise ModelFailed(err) from err
    finally:
        model.train(was_training)
