"""What a model needs to know about the data: the task and the shape of one sample."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

TaskName = Literal["classification", "regression", "lm"]


@dataclass(frozen=True, slots=True)
class DataSpec:
    task: TaskName
    """classification (integer labels), regression (float targets) or lm (next-token prediction)."""
    input_shape: tuple[int, ...]
    """Shape of one input sample: (C, H, W) for images, (F,) for tables, (T,) for token windows."""
    num_classes: int | None = None
    """Number of classes (classification)."""
    num_outputs: int | None = None
    """Number of regression targets (regression)."""
    vocab_size: int | None = None
    """Vocabulary size (lm)."""
    uint8_pixels: bool = False
    """Images arrive as uint8 in [0, 255] and become float32 on the device (data/pixels.py)."""
    pixel_mean: tuple[float, ...] | None = None
    """Per-channel mean of the [0, 1]-scaled training images, subtracted on the device."""
    pixel_std: tuple[float, ...] | None = None
    """Per-channel standard deviation of the [0, 1]-scaled training images, divided by on the device."""
    size_field: str | None = None
    """The config field that sets the size of these samples (data.image_size for image folders,
    data.shape for synthetic data); None where the source's size is fixed (digits, MNIST, a table)."""
    pad_id: int | None = None
    """Token sequences padded on the right with this id (text_classes): a classifier reads each
    sequence up to its last other token, and a Hugging Face model is given the matching attention mask."""
    document_end: int | None = None
    """Token sequences that pack several documents, each ending with this id (instructions): a model
    that can keeps attention and positions within each document (models/gpt.py)."""
    class_names: tuple[str, ...] | None = None
    """Classification: the name of each class id, in order, where the source has names (text_classes)."""

    @property
    def num_model_outputs(self) -> int:
        """Width of the model's last layer for this task."""
        if self.task == "classification":
            assert self.num_classes is not None
            return self.num_classes
        if self.task == "regression":
            return self.num_outputs or 1
        assert self.vocab_size is not None
        return self.vocab_size

    @property
    def is_image(self) -> bool:
        return len(self.input_shape) == 3


def example_input(data: Any) -> torch.Tensor | None:
    """One sample's input from a Dataset or DataLoader (shape and dtype only matter), or None."""
    try:
        if isinstance(data, torch.utils.data.DataLoader):
            data = data.dataset
        sample = data[0]
        x = sample[0] if isinstance(sample, (list, tuple)) else sample
        return x if isinstance(x, torch.Tensor) else None
    except Exception:  # noqa: BLE001 — an unusual dataset: the caller does without
        return None
