"""Images in one sub-folder per class (PNG, JPEG, ... through Pillow), decoded per sample.

Layouts: `path/<class>/*.png` (split into train/val/test by the seeded fractions), or
`path/train/<class>/...` with optional `path/val/` (or `valid/`, `validation/`) and `path/test/`
(the ImageNet layout; those folders are the splits). Every image is converted to RGB, resized so
its shorter side fits `data.image_size`, and centre-cropped to it. Decoding happens in
`__getitem__`, so DataLoader workers run it in parallel and the files are never all in memory.

Samples are uint8 [3, H, W]: the trainer scales them to [0, 1] floats on the device
(data/pixels.py, driven by the spec's `uint8_pixels`), and with `data.normalize` standardises
the channels with the mean/std of up to 256 training images (seeded sample, train split only).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import split_indices
from gputrain.errors import ConfigError, DataError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
_VAL_NAMES = ("val", "valid", "validation")
_STATS_SAMPLES = 256


class ImageDecodeError(DataError):
    """An image file Pillow cannot decode. Stays one short line when a DataLoader worker raised it."""

    def __init__(self, text: str) -> None:
        if text.startswith(f"Caught {type(self).__name__}"):
            # torch re-raises a worker's error as type(header + traceback): keep our line, say which worker
            where = text.split("\n", 1)[0].removeprefix(f"Caught {type(self).__name__} ").rstrip(".")
            text = f"{text.rstrip().rsplit(type(self).__name__ + ': ', 1)[-1]} ({where})"
        super().__init__(text)


def decode_image(path: str, size: tuple[int, int]) -> torch.Tensor:
    """One image file -> uint8 [3, H, W]: shorter side resized to fit, centre crop.

    Raises:
        DataError: naming the file when Pillow cannot decode it.
    """
    from PIL import Image

    height, width = size
    try:
        with Image.open(path) as img:
            # JPEG: let the decoder downscale by a power of two first (much faster for large photos)
            img.draft("RGB", (width, height))
            img = img.convert("RGB")
            scale = max(width / img.width, height / img.height)
            resized = (max(width, round(img.width * scale)), max(height, round(img.height * scale)))
            img = img.resize(resized, Image.Resampling.BILINEAR)
            left, top = (resized[0] - width) // 2, (resized[1] - height) // 2
            array = np.asarray(img.crop((left, top, left + width, top + height)), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        raise ImageDecodeError(f"{path}: cannot decode image: {err}") from None
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


class ImageFolderData(Dataset):
    """(image uint8 [3, H, W], class index) pairs, decoded on access. Scaling and normalisation
    happen on the training device, from the bundle's spec (module docstring)."""

    def __init__(self, files: list[str], labels: list[int], size: tuple[int, int]) -> None:
        self.files, self.labels, self.size = files, labels, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return decode_image(self.files[index], self.size), self.labels[index]

    def subset(self, indices: list[int] | np.ndarray) -> ImageFolderData:
        return ImageFolderData([self.files[i] for i in indices], [self.labels[i] for i in indices], self.size)


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images_in(folder: Path) -> list[str]:
    return sorted(
        e.path
        for e in os.scandir(folder)
        if e.is_file() and Path(e.name).suffix.lower() in IMAGE_SUFFIXES and not e.name.startswith(".")
    )


def scan_classes(folder: Path, classes: list[str] | None = None) -> tuple[list[str], list[str], list[int]]:
    """(class names, files, labels) of one split folder; `classes` fixes the names (from train).

    Raises:
        DataError: no class folders, an empty class folder, or a class the training split lacks.
    """
    folders = _subfolders(folder)
    if not folders:
        raise DataError(f"{folder}: no class folders; image_folder expects one sub-folder of images per class")
    names = [p.name for p in folders] if classes is None else classes
    files: list[str] = []
    labels: list[int] = []
    for class_folder in folders:
        if class_folder.name not in names:
            raise DataError(f"{class_folder}: class {class_folder.name!r} is not among the training classes")
        images = _images_in(class_folder)
        if not images:
            raise DataError(f"{class_folder}: class folder holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        files += images
        labels += [names.index(class_folder.name)] * len(images)
    return names, files, labels


def _channel_stats(data: ImageFolderData, seed: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std of the [0, 1]-scaled pixels of a seeded sample of training images."""
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randperm(len(data), generator=generator)[:_STATS_SAMPLES].tolist()
    pixels = torch.stack([decode_image(data.files[i], data.size) for i in picks]).transpose(0, 1).flatten(1)
    pixels = pixels.double() / 255.0
    mean, std = pixels.mean(dim=1), pixels.std(dim=1).clamp_min(1e-3)
    return tuple(mean.tolist()), tuple(std.tolist())


def _cap(data: ImageFolderData | None, limit: int | None) -> ImageFolderData | None:
    """At most `limit` samples, evenly spaced (fixed, so every evaluation sees the same ones)."""
    if data is None or limit is None or len(data) <= limit:
        return data
    return data.subset(np.linspace(0, len(data) - 1, limit).round().astype(int))


@register_data("image_folder")
def build_image_folder(config: DataConfig, seed: int) -> DataBundle:
    if config.path is None:
        raise ConfigError("data.path", "data.name=image_folder needs a folder with one sub-folder per class")
    root = Path(config.path)
    if not root.is_dir():
        raise DataError(f"data.path: no such folder: {root}")
    size = (config.image_size, config.image_size) if isinstance(config.image_size, int) else tuple(config.image_size)
    val: ImageFolderData | None
    test: ImageFolderData | None
    if (root / "train").is_dir() and _subfolders(root / "train"):
        classes, files, labels = scan_classes(root / "train")
        train = ImageFolderData(files, labels, size)  # type: ignore[arg-type]
        val_dir = next((root / n for n in _VAL_NAMES if (root / n).is_dir()), None)
        val = ImageFolderData(*scan_classes(val_dir, classes)[1:], size) if val_dir else None  # type: ignore[arg-type]
        test = (
            ImageFolderData(*scan_classes(root / "test", classes)[1:], size)  # type: ignore[arg-type]
            if (root / "test").is_dir()
            else None
        )
    else:
        classes, files, labels = scan_classes(root)
        everything = ImageFolderData(files, labels, size)  # type: ignore[arg-type]
        train_idx, val_idx, test_idx = split_indices(len(files), config.val_fraction, config.test_fraction, seed)
        if len(train_idx) == 0:
            raise ConfigError(
                "data.val_fraction", f"leaves no training images out of {len(files)}", config.val_fraction
            )
        train = everything.subset(train_idx.tolist())
        val = everything.subset(val_idx.tolist()) if len(val_idx) else None
        test = everything.subset(test_idx.tolist()) if len(test_idx) else None
    mean, std = _channel_stats(train, seed) if config.normalize else (None, None)
    spec = DataSpec(
        task="classification",
        input_shape=(3, *size),
        num_classes=len(classes),
        uint8_pixels=True,
        pixel_mean=mean,
        pixel_std=std,
    )
    return DataBundle(
        train=train, val=_cap(val, config.max_eval_samples), test=_cap(test, config.max_eval_samples), spec=spec
    )
