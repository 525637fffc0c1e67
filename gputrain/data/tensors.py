"""In-memory data held as tensors, with a seeded split and train-only normalisation."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset

from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError


class TensorData(Dataset):
    """Samples as rows of whole tensors of one length: (inputs, targets), or any other tuple of
    them, as a TensorDataset holds. The trainer indexes them a batch at a time (no per-sample
    collate), and may move them to the device once when they are small. A batch is the tuple of
    each tensor's rows, as a sample is the tuple of each tensor's row."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        if not tensors:
            raise ValueError("no tensors")
        if any(len(t) != len(tensors[0]) for t in tensors):
            raise ValueError("tensors of different lengths: " + ", ".join(str(len(t)) for t in tensors))
        self.tensors = tensors

    @property
    def inputs(self) -> torch.Tensor:
        return self.tensors[0]

    @property
    def targets(self) -> torch.Tensor:
        """The second tensor: the targets of (inputs, targets) data."""
        if len(self.tensors) != 2:
            raise AttributeError(f"targets: this data holds {len(self.tensors)} tensors, not (inputs, targets)")
        return self.tensors[1]

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in self.tensors)

    def batch(self, indices: torch.Tensor, pin: bool = False) -> tuple[torch.Tensor, ...]:
        """The samples at `indices`; `pin`: gathered straight into pinned host memory (for a copy
        to the GPU that does not block the host)."""
        tensors = self.tensors
        if not pin:
            if len(tensors) == 2:  # (inputs, targets): no loop, which costs a small model's step ~0.5 us
                return tensors[0][indices], tensors[1][indices]
            return tuple([t[indices] for t in tensors])
        return tuple([_gather_pinned(t, indices) for t in tensors])

    def rows(self, index: slice | torch.Tensor) -> TensorData:
        """The samples at `index` (a slice is a view, an index tensor a copy)."""
        return TensorData(*(t[index] for t in self.tensors))

    def to(self, device: torch.device) -> TensorData:
        return TensorData(*(t.to(device) for t in self.tensors))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def as_tensor_data(data: Any) -> Any:
    """`data` as TensorData where torch's own data set classes say its samples are rows of tensors
    held in memory: a TensorDataset (of any number of tensors), a Subset of such data (nested or
    not: its rows are gathered once, a copy), or a ConcatDataset of such parts whose tensors agree
    in number, dtype and row shape (joined once, a copy). Batches are then gathered by one index
    operation per tensor, with no worker processes and no per-sample collate; the samples and
    their order are the same. Any other data set (or a DataLoader) is returned as it is: a
    subclass's `__getitem__` is the user's code, which only it can run (data/feed.py reads such
    data in this process when a sample is cheap to read)."""
    if isinstance(data, TensorData):
        return data
    if _reads_as(data, TensorDataset) and data.tensors and len({t.device for t in data.tensors}) == 1:
        return TensorData(*data.tensors)
    if _reads_as(data, Subset):
        inner = as_tensor_data(data.dataset)
        if isinstance(inner, TensorData):
            return inner.rows(torch.as_tensor(list(data.indices), dtype=torch.long, device=inner.device))
    if _reads_as(data, ConcatDataset):
        return _joined([as_tensor_data(part) for part in data.datasets], data)
    return data


def _reads_as(data: Any, cls: type) -> bool:
    """`data` is a `cls` whose samples are read by `cls`'s own code: a subclass that overrides
    `__getitem__` (a transform, say) reads them its own way, which only it can do."""
    return isinstance(data, cls) and getattr(type(data), "__getitem__", None) is getattr(cls, "__getitem__", None)


def _joined(parts: list[Any], data: ConcatDataset) -> Any:
    """The parts of a ConcatDataset as one TensorData, or `data` itself where they cannot be joined."""
    if not parts or not all(isinstance(p, TensorData) for p in parts):
        return data
    first = parts[0]

    def kind(t: torch.Tensor) -> tuple[Any, ...]:
        return t.dtype, t.device, t.shape[1:]

    if any(len(p.tensors) != len(first.tensors) for p in parts) or any(
        kind(t) != kind(u) for p in parts for t, u in zip(p.tensors, first.tensors)
    ):
        return data
    return TensorData(*(torch.cat(columns) for columns in zip(*(p.tensors for p in parts))))


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
