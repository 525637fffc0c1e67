"""Images travel as uint8 and become floats on the training device.

A decoded image is 1 byte per pixel and channel; as float32 it is 4. Keeping the bytes until the
device means the DataLoader workers do no float arithmetic, pass a quarter of the data to the
main process, and the host→device copy moves a quarter of the bytes. The device then scales to
[0, 1] and standardises the whole batch at once, which costs it next to nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gputrain.data.spec import DataSpec, example_input

BatchTransform = Callable[[Any], Any]


def is_uint8_image(sample: torch.Tensor) -> bool:
    """A [C, H, W] uint8 sample: an image the trainer hands to the model as float32."""
    return sample.dtype == torch.uint8 and sample.dim() == 3


def as_model_sees_it(sample: torch.Tensor | None) -> torch.Tensor | None:
    """A sample with the dtype the model will receive it in (for estimates made from raw data)."""
    return sample.float() if sample is not None and is_uint8_image(sample) else sample


def pixel_scaler(spec: DataSpec | None, device: torch.device) -> BatchTransform | None:
    """For data whose spec says its images are uint8: a batch function that turns the images into
    float32 in [0, 1], standardised with the spec's per-channel mean and std when it has them.
    None for every other kind of data."""
    if spec is None or not spec.uint8_pixels:
        return None
    channels = spec.input_shape[0]
    mean = std = None
    if spec.pixel_mean is not None and spec.pixel_std is not None:
        mean = torch.tensor(spec.pixel_mean, dtype=torch.float32, device=device).view(1, channels, 1, 1)
        std = torch.tensor(spec.pixel_std, dtype=torch.float32, device=device).view(1, channels, 1, 1)

    def scale(batch: Any) -> Any:
        if not isinstance(batch, (list, tuple)) or not batch:
            return batch
        images = batch[0]
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
            return batch
        images = images.float().div_(255.0)
        if mean is not None and std is not None:
            images = images.sub_(mean).div_(std)
        rest = list(batch[1:])
        return [images, *rest] if isinstance(batch, list) else (images, *rest)

    return scale


def pixel_scaler_for(spec: DataSpec | None, data: Any, device: torch.device) -> BatchTransform | None:
    """`pixel_scaler` from the spec when there is one. A user's data set without a spec whose
    samples are uint8 images ([C, H, W]) is scaled to [0, 1] too, without standardisation: a
    model cannot take bytes, and [0, 1] is what torchvision's ToTensor would have given."""
    if spec is not None:
        return pixel_scaler(spec, device)
    sample = example_input(data)
    if sample is None or not is_uint8_image(sample):
        return None
    return pixel_scaler(DataSpec(task="classification", input_shape=tuple(sample.shape), uint8_pixels=True), device)
