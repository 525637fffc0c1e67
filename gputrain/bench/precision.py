"""Pin what "fp32" means while a benchmark runs: true IEEE FP32, or TF32 tensor cores."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from gputrain.switches import tf32

__all__ = ["fp32_precision"]


@contextmanager
def fp32_precision(mode: Literal["ieee", "tf32"]) -> Iterator[None]:
    """cuBLAS matmuls and cuDNN convolutions in `mode` for the block, then as they were
    (through the one TF32 switch the trainer uses too: see gputrain/switches.py)."""
    with tf32(mode == "tf32"):
        yield
