"""scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), as 1x8x8 images.

Read straight from the CSV that ships inside scikit-learn, so no network and no slow import
of `sklearn.datasets`.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch

from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import split_tensors
from gputrain.errors import DataError


def _digits_file() -> Path:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DataError("data.name=digits needs scikit-learn (pip install scikit-learn)")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise DataError(f"scikit-learn's digits file is missing: {path}; reinstall scikit-learn")
    return path


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images float32 [N, 1, 8, 8] in 0..16, labels int64 [N])."""
    with gzip.open(_digits_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1].reshape(-1, 1, 8, 8), table[:, -1].astype(np.int64)


@register_data("digits")
def build_digits(config: DataConfig, seed: int) -> DataBundle:
    images, labels = load_digits_arrays()
    spec = DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10)
    return split_tensors(torch.from_numpy(images), torch.from_numpy(labels), spec, config, seed)
