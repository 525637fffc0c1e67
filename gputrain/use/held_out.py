"""A held-out batch of the run's own data, in both forms: raw (as the data source gives samples,
what an exported model with the preprocessing inside takes) and as the model saw such samples in
training (through the data pipeline's own normalisation and pixel scaling).

Comparing an artifact fed the first with the eager model fed the second checks the export and the
preprocessing inside it at once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from gputrain.data import build_data
from gputrain.data.pixels import pixel_scaler
from gputrain.use.loaded import LoadedRun

SPLIT_ORDER = ("test", "val", "train")


@dataclass(frozen=True, slots=True)
class HeldOut:
    split: str
    raw: torch.Tensor
    """[N, ...] samples as the data source gives them, on the host."""
    model_inputs: torch.Tensor
    """The same samples as training fed them to the model, on the host."""


def evenly_spaced(size: int, count: int) -> list[int]:
    """`count` indices of 0..size-1 spread evenly over them, the first and the last included."""
    return np.linspace(0, size - 1, count).round().astype(int).tolist()


def tile(raw: torch.Tensor, batch: int) -> torch.Tensor:
    """`batch` samples, those of `raw` repeated as needed."""
    reps = math.ceil(batch / len(raw))
    return raw.repeat(reps, *[1] * (raw.dim() - 1))[:batch].contiguous()


def example_pair(raw: torch.Tensor) -> torch.Tensor:
    """Two samples to capture a graph with: a batch of one would fix its batch size at 1."""
    return tile(raw, 2)


def held_out_batch(loaded: LoadedRun, size: int) -> HeldOut:
    """Up to `size` samples spread evenly over the run's test split (else val, else train)."""
    bundle = loaded.data
    split = next(name for name in SPLIT_ORDER if getattr(bundle, name) is not None)
    data = getattr(bundle, split)
    raw_data = data
    pre = loaded.pre
    if pre.mean is not None and not pre.pixels:  # the source normalised its splits: rebuild them raw
        unnormalised = dataclasses.replace(loaded.config.data, normalize=False)
        raw_data = getattr(build_data(unnormalised, loaded.config.train.seed), split)
    picks = evenly_spaced(len(data), min(size, len(data)))
    raw = torch.stack([torch.as_tensor(raw_data[i][0]) for i in picks])
    inputs = torch.stack([torch.as_tensor(data[i][0]) for i in picks])
    scale = pixel_scaler(loaded.data.spec, torch.device("cpu"))
    if scale is not None:  # what training's batch transform does on the device
        inputs = scale([inputs])[0]
    return HeldOut(split, raw, inputs)
