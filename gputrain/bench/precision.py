"""Pin what "fp32" means while a benchmark runs: true IEEE FP32, or TF32 tensor cores.

Uses the `fp32_precision` API (torch >= 2.9) only: mixing it with the legacy `allow_tf32` flags
makes torch raise, and the trainer may already have used the new one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch

__all__ = ["fp32_precision"]


@contextmanager
def fp32_precision(mode: Literal["ieee", "tf32"]) -> Iterator[None]:
    """Set cuBLAS matmul and cuDNN conv FP32 precision for the block, then restore both."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    saved = (matmul.fp32_precision, conv.fp32_precision)
    matmul.fp32_precision = conv.fp32_precision = mode
    try:
        yield
    finally:
        matmul.fp32_precision, conv.fp32_precision = saved
