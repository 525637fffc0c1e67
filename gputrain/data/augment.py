"""Image-batch work done on the device, so the CPU is not what limits an image job: random crop
(with zero padding), horizontal flip, and the channels_last layout conv nets run fastest in.

Random numbers come from the global torch RNG of the batch's device, which checkpoints capture,
so a resumed run draws exactly the crops and flips the uninterrupted run would have.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

AUGMENTS = ("crop", "flip")


def crop_padding(height: int) -> int:
    """Padding of the random crop: 4 px for 32 px images (the CIFAR recipe), 1 px for 8 px digits."""
    return max(1, height // 8)


def random_crop(images: torch.Tensor, padding: int) -> torch.Tensor:
    """Each image of an [N, C, H, W] batch cropped back to H x W at a random offset of its
    zero-padded self: one gather for the whole batch, no per-image loop."""
    n, c, h, w = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    device = images.device
    dy = torch.randint(0, 2 * padding + 1, (n, 1), device=device)
    dx = torch.randint(0, 2 * padding + 1, (n, 1), device=device)
    rows = (dy + torch.arange(h, device=device)).view(n, 1, h, 1).expand(n, c, h, w + 2 * padding)
    picked_rows = padded.gather(2, rows)
    cols = (dx + torch.arange(w, device=device)).view(n, 1, 1, w).expand(n, c, h, w)
    return picked_rows.gather(3, cols)


def random_flip(images: torch.Tensor) -> torch.Tensor:
    """Mirror each image left-right with probability 1/2."""
    flip = torch.rand(images.shape[0], device=images.device) < 0.5
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(3), images)


def _is_image_batch(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point()


def build_batch_transform(
    augment: Sequence[str], channels_last: bool, pixels: Callable[[Any], Any] | None = None
) -> Callable[[Any], Any] | None:
    """A function applied to each training micro-batch (inputs, targets, ...) on the device, or
    None when there is nothing to do. `pixels` (data/pixels.py) first turns uint8 images into
    floats; then only 4-D floating-point inputs are touched."""
    unknown = [name for name in augment if name not in AUGMENTS]
    if unknown:
        raise ValueError(f"unknown augmentation {unknown[0]!r}")
    if not augment and not channels_last:
        return pixels

    def transform(batch: Any) -> Any:
        if pixels is not None:
            batch = pixels(batch)
        if not isinstance(batch, (list, tuple)) or not batch or not _is_image_batch(batch[0]):
            return batch
        images = batch[0]
        if "crop" in augment:
            images = random_crop(images, crop_padding(images.shape[2]))
        if "flip" in augment:
            images = random_flip(images)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        rest = list(batch[1:])
        return [images, *rest] if isinstance(batch, list) else (images, *rest)

    return transform


def is_conv_net(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def apply_channels_last(
    model: torch.nn.Module, device: torch.device, sharded: bool = False, pipelined: bool = False
) -> bool:
    """Put a conv net's weights in channels_last on CUDA (cuDNN's tensor-core kernels want NHWC).
    Returns whether it did.

    Not when the weights will be sharded (FSDP2 refuses non-contiguous parameters) or cut into
    pipeline stages (stages exchange activations as raw bytes, and older torch receives them as
    contiguous NCHW): the inputs then stay NCHW too."""
    if device.type != "cuda" or not is_conv_net(model) or sharded or pipelined:
        return False
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return True
