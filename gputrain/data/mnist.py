"""MNIST and Fashion-MNIST from the IDX files as distributed, read from `data.path`.

The four files (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`,
`t10k-labels-idx1-ubyte`, each optionally `.gz`) sit in `data.path` or its `raw/` sub-folder
(torchvision's layout). The train files are split into train/val (`data.val_fraction`); the
t10k files are the test split. Pixels are standardised with the training split's statistics.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from gputrain.config.paths import check_data_path
from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import TensorData, split_indices
from gputrain.errors import ConfigError, DataError

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
_WHERE = (
    "MNIST: https://ossci-datasets.s3.amazonaws.com/mnist/ (the mirror torchvision uses); "
    "Fashion-MNIST: https://github.com/zalandoresearch/fashion-mnist (same file names)"
)
_IDX_UBYTE = 0x08  # the only element type MNIST uses; IDX also defines int8..float64


def find_file(folder: Path, name: str) -> Path:
    """The file `name` or `name.gz` in `folder` or `folder/raw`, else a DataError saying where to get it."""
    for where in (folder, folder / "raw"):
        for candidate in (where / name, where / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise DataError(f"data.path: {name} (or {name}.gz) not found in {folder}; download it from {_WHERE}")


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes with `ndim` dimensions, checked against its header.

    Raises:
        DataError: naming the file, for a wrong magic number, dimension count or length.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{path}: cannot read: {err}") from None
    expected_magic = (_IDX_UBYTE << 8) | ndim
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if magic != expected_magic:
        shown = "missing" if magic is None else f"0x{magic:08x}"
        raise DataError(
            f"{path}: not an IDX file of {ndim}-d unsigned bytes: magic number {shown}, expected 0x{expected_magic:08x}"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} bytes)")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + math.prod(dims)  # Python ints: a forged header cannot overflow into a match
    if len(raw) != expected:
        raise DataError(f"{path}: {len(raw)} bytes, but its header ({' x '.join(map(str, dims))}) needs {expected}")
    if not dims[0]:
        raise DataError(f"{path}: holds no items (its header says 0)")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def check_labels(train_path: Path, train: np.ndarray, test_path: Path, test: np.ndarray) -> int:
    """The number of classes, max label + 1, after checking the labels form a class set.

    A label beyond the rest (255 in a file of digits, a flipped bit) would otherwise silently add
    that many classes; a test label the training labels lack is a class the model never saw. Class
    0 may be absent (EMNIST letters count from 1).

    Raises:
        DataError: naming the file, the item and the label.
    """
    present = np.zeros(256, dtype=bool)
    present[np.unique(train)] = True
    top = int(train.max())
    if present.sum() < 2:
        raise DataError(f"{train_path}: every label is {top}; classification needs at least two classes")
    absent = [c for c in range(1, top) if not present[c]]
    if absent:
        item = int(np.flatnonzero(train == top)[0])
        shown = ", ".join(map(str, absent[:5])) + (" ..." if len(absent) > 5 else "")
        raise DataError(
            f"{train_path}: label {top} at item {item}, but labels {shown} never occur: not the labels of "
            f"{top + 1} classes (a damaged file?)"
        )
    unseen = ~present[test]
    if unseen.any():
        item = int(np.flatnonzero(unseen)[0])
        raise DataError(
            f"{test_path}: label {int(test[item])} at item {item} never occurs in the training labels "
            f"({train_path.name}: {', '.join(str(c) for c in np.flatnonzero(present))})"
        )
    return top + 1


def load_split(folder: Path, images_key: str, labels_key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images float32 [N, 1, H, W] in [0, 1], labels int64 [N]) from one images/labels file pair."""
    images_path, labels_path = find_file(folder, FILES[images_key]), find_file(folder, FILES[labels_key])
    images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
    if len(images) != len(labels):
        raise DataError(f"{labels_path}: {len(labels)} labels for the {len(images)} images of {images_path}")
    inputs = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return inputs, torch.from_numpy(labels.astype(np.int64))


@register_data("mnist")
def build_mnist(config: DataConfig, seed: int) -> DataBundle:
    if config.path is None:
        raise ConfigError("data.path", "data.name=mnist needs the folder holding the IDX files", hint=_WHERE)
    check_data_path(config)
    folder = Path(config.path)
    inputs, targets = load_split(folder, "train_images", "train_labels")
    test_inputs, test_targets = load_split(folder, "test_images", "test_labels")
    if test_inputs.shape[1:] != inputs.shape[1:]:
        raise DataError(
            f"{find_file(folder, FILES['test_images'])}: images are {' x '.join(map(str, test_inputs.shape[2:]))}, "
            f"but the training images ({FILES['train_images']}) are {' x '.join(map(str, inputs.shape[2:]))}"
        )
    train_labels, test_labels = find_file(folder, FILES["train_labels"]), find_file(folder, FILES["test_labels"])
    num_classes = check_labels(train_labels, targets.numpy(), test_labels, test_targets.numpy())
    train_idx, val_idx, _ = split_indices(len(inputs), config.val_fraction, 0.0, seed)
    train_x, val_x = inputs[train_idx], inputs[val_idx]
    if config.normalize:
        # one grey channel: a single mean and std, from the training split only
        mean, std = train_x.mean(), train_x.std().clamp_min(1e-8)
        train_x, val_x, test_inputs = ((t - mean) / std for t in (train_x, val_x, test_inputs))
    spec = DataSpec(task="classification", input_shape=tuple(inputs.shape[1:]), num_classes=num_classes)
    val = TensorData(val_x.contiguous(), targets[val_idx]) if len(val_idx) else None
    return DataBundle(
        train=TensorData(train_x.contiguous(), targets[train_idx]),
        val=val,
        test=TensorData(test_inputs.contiguous(), test_targets),
        spec=spec,
    )
