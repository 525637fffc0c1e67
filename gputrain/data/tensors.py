"""In-memory data held as tensors, with a seeded split and train-only normalisation."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError


class TensorData(Dataset):
    """Inputs and targets as whole tensors. The trainer indexes them a batch at a time
    (no per-sample collate), and may move them to the device once when they are small."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        self.inputs = inputs
        self.targets = targets

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]

    def batch(self, indices: torch.Tensor, pin: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at `indices`; `pin`: gathered straight into pinned host memory (for a copy
        to the GPU that does not block the host)."""
        if not pin:
            return self.inputs[indices], self.targets[indices]
        return _gather_pinned(self.inputs, indices), _gather_pinned(self.targets, indices)

    def to(self, device: torch.device) -> TensorData:
        return TensorData(self.inputs.to(device), self.targets.to(device))

    @property
    def nbytes(self) -> int:
        return self.inputs.nbytes + self.targets.nbytes


def as_tensor_data(data: Any) -> Any:
    """`data` as TensorData where its samples are rows of tensors held in memory: a TensorDataset
    of (inputs, targets), or a Subset of one. Batches are then gathered by one index operation
    each, with no worker processes and no per-sample collate; the samples and their order are the
    same. Any other data set (or a DataLoader) is returned as it is."""
    if isinstance(data, TensorData):
        return data
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return TensorData(*data.tensors)
    if isinstance(data, Subset):
        inner = as_tensor_data(data.dataset)
        if isinstance(inner, TensorData):
            index = torch.as_tensor(list(data.indices), dtype=torch.long)
            return TensorData(inner.inputs[index], inner.targets[index])
    return data


def _gather_pinned(source: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    out = torch.empty((len(indices), *source.shape[1:]), dtype=source.dtype, pin_memory=True)
    return torch.index_select(source, 0, indices, out=out)


def split_indices(n: int, val_fraction: float, test_fraction: float, seed: int) -> tuple[torch.Tensor, ...]:
    """A seeded permutation cut into train / val / test index sets."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = round(n * test_fraction)
    n_val = round(n * val_fraction)
    return order[n_test + n_val :], order[n_test : n_test + n_val], order[:n_test]


def _standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    """Scale by the training split's statistics: per channel for images, per feature for tables."""
    dims = (0, 2, 3) if train.dim() == 4 else (0,)
    mean = train.mean(dim=dims, keepdim=True)
    std = train.std(dim=dims, keepdim=True)
    std = torch.where(std > 1e-8, std, torch.ones_like(std))  # a constant column stays finite
    return [(t - mean) / std for t in (train, *others)]


def split_tensors(
    inputs: torch.Tensor, targets: torch.Tensor, spec: DataSpec, config: DataConfig, seed: int
) -> DataBundle:
    """Split in-memory data into train/val/test (seeded), normalising with train statistics only."""
    train_idx, val_idx, test_idx = split_indices(len(inputs), config.val_fraction, config.test_fraction, seed)
    if len(train_idx) == 0:
        raise ConfigError("data.val_fraction", f"leaves no training samples out of {len(inputs)}", config.val_fraction)
    parts = [inputs[train_idx], inputs[val_idx], inputs[test_idx]]
    if config.normalize and inputs.is_floating_point():
        parts = _standardise(*parts)
    train, val, test = (TensorData(x.contiguous(), targets[i]) for x, i in zip(parts, (train_idx, val_idx, test_idx)))
    return DataBundle(train=train, val=val if len(val) else None, test=test if len(test) else None, spec=spec)
