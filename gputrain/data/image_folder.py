"""Images in one sub-folder per class (PNG, JPEG, ... through Pillow), decoded per sample.

Layouts: `path/<class>/*.png` (split into train/val/test by the seeded fractions), or
`path/train/<class>/...` with optional `path/val/` (or `valid/`, `validation/`) and `path/test/`
(the ImageNet layout; those folders are the splits). A class folder's images may sit in
sub-folders of it (as torchvision's ImageFolder reads them). Every image is converted to RGB
(16-bit and floating-point greyscale scaled to 8 bits, not clipped), resized so its shorter side
fits `data.image_size`, and centre-cropped to it. Decoding happens in `__getitem__`, so
DataLoader workers run it in parallel and the files are never all in memory.

Samples are uint8 [3, H, W]: the trainer scales them to [0, 1] floats on the device
(data/pixels.py, driven by the spec's `uint8_pixels`), and with `data.normalize` standardises
the channels with the mean/std of up to 256 training images (seeded sample, train split only).

What is checked before training: every class folder holds at least one image Pillow can open (a
class with none would be a class the model can never see), val/test classes are training classes,
and the statistics sample decodes. An image that cannot be decoded is the guard's business
(data/guard.py) wherever it is read: in the statistics pass here (`data.on_error=fail`: a
DataError naming the file and the split; `skip`: left out of the statistics), and mid-run in
training and evaluation.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from gputrain.config.paths import check_data_path
from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import split_indices
from gputrain.errors import ConfigError, DataError, first_line

log = logging.getLogger("gputrain")

IMAGE_SUFFIXES = {
    ".png",
    ".jpg",
    ".jpeg",
    ".jpe",
    ".jfif",
    ".bmp",
    ".gif",
    ".webp",
    ".tif",
    ".tiff",
    ".ppm",
    ".pgm",
    ".pbm",
    ".pnm",
}
_VAL_NAMES = ("val", "valid", "validation")
_SPLIT_NAMES = ("train", *_VAL_NAMES, "test")
_STATS_SAMPLES = 256
_SKIP_HINT = "set data.on_error=skip to skip unreadable images"


class ImageDecodeError(OSError):
    """An image file Pillow cannot decode, met while reading a sample (mid-run: the guard names
    it with its split, or the trainer with its step). Stays one short line when a DataLoader
    worker raised it."""

    def __init__(self, text: str) -> None:
        if text.startswith(f"Caught {type(self).__name__}"):
            # torch re-raises a worker's error as type(header + traceback): keep our line, say which worker
            where = text.split("\n", 1)[0].removeprefix(f"Caught {type(self).__name__} ").rstrip(".")
            text = f"{text.rstrip().rsplit(type(self).__name__ + ': ', 1)[-1]} ({where})"
        super().__init__(text)


def _to_8bit(img: Any) -> Any:
    """A 16-bit ('I;16…'), 32-bit integer ('I') or floating-point ('F') greyscale image as 8-bit 'L'.

    Pillow's own conversion clips these at 255, which turns a 16-bit image almost white. 16-bit
    values are scaled by 255/65535; 'I' images by the same when they exceed 255; 'F' images holding
    values in [0, 1] by 255 (others are clipped to [0, 255])."""
    from PIL import Image

    array = np.asarray(img, dtype=np.float64)
    if img.mode.startswith("I;16") or (img.mode == "I" and array.size and array.max() > 255):
        array = array * (255.0 / 65535.0)
    elif img.mode == "F" and array.size and array.min() >= 0.0 and array.max() <= 1.0:
        array = array * 255.0
    return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8), "L")


def decode_image(path: str, size: tuple[int, int]) -> torch.Tensor:
    """One image file -> uint8 [3, H, W]: shorter side resized to fit, centre crop.

    Raises:
        ImageDecodeError: naming the file, whatever went wrong inside Pillow.
    """
    from PIL import Image

    height, width = size
    try:
        with Image.open(path) as img:
            # JPEG: let the decoder downscale by a power of two first (much faster for large photos)
            img.draft("RGB", (width, height))
            if img.mode.startswith("I") or img.mode == "F":
                img = _to_8bit(img)
            img = img.convert("RGB")
            scale = max(width / img.width, height / img.height)
            resized = (max(width, round(img.width * scale)), max(height, round(img.height * scale)))
            img = img.resize(resized, Image.Resampling.BILINEAR)
            left, top = (resized[0] - width) // 2, (resized[1] - height) // 2
            array = np.asarray(img.crop((left, top, left + width, top + height)), dtype=np.uint8)
    except Exception as err:  # noqa: BLE001 - malformed files make Pillow raise all sorts (struct.error, ...)
        raise ImageDecodeError(f"{path}: cannot decode image: {first_line(err)}") from None
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


def _visible(name: str) -> bool:
    return not name.startswith(".") and name not in ("Thumbs.db", "desktop.ini", "__MACOSX")


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and _visible(p.name))


def _is_image_name(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_SUFFIXES


class _Scan:
    """Files met while scanning that are not used, reported once as one warning."""

    def __init__(self) -> None:
        self.ignored: list[str] = []

    def warn(self) -> None:
        if self.ignored:
            log.warning(
                "image_folder: %d files not used (not images by their suffix, or outside any class folder), e.g. %s",
                len(self.ignored),
                self.ignored[0],
            )


def _images_in(folder: Path, scan: _Scan) -> list[str]:
    """The image files in a class folder and its sub-folders (hidden ones left out), sorted. One
    scandir per folder: a file's type comes with its directory entry, not from a stat of its own."""
    images: list[str] = []
    seen = {os.path.realpath(folder)}
    pending = [str(folder)]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if not _visible(entry.name):
                    continue
                if entry.is_dir():
                    real = os.path.realpath(entry.path)
                    if real not in seen:  # a symlink back up the tree: not read again
                        seen.add(real)
                        pending.append(entry.path)
                elif entry.is_file() and _is_image_name(entry.name):
                    images.append(entry.path)
                else:
                    scan.ignored.append(entry.path)
    return sorted(images)


def _first_readable(files: list[str]) -> tuple[str | None, str]:
    """(the first file Pillow can open, else None; the problem with the first that could not be)."""
    from PIL import Image

    problem = ""
    for path in files:
        try:
            with Image.open(path):
                return path, problem
        except Exception as err:  # noqa: BLE001 - any failure to identify the file
            problem = problem or f"{path}: {first_line(err)}"
    return None, problem


def scan_classes(
    folder: Path, classes: list[str] | None = None, scan: _Scan | None = None
) -> tuple[list[str], list[str], list[int]]:
    """(class names, files, labels) of one split folder; `classes` fixes the names (from train).

    Raises:
        DataError: no class folders, a class folder without an image Pillow can open, or a class
            the training split lacks.
    """
    scan = scan if scan is not None else _Scan()
    folders = _subfolders(folder)
    if not folders:
        raise DataError(f"{folder}: no class folders; image_folder expects one sub-folder of images per class")
    scan.ignored += sorted(
        str(p) for p in folder.iterdir() if p.is_file() and _visible(p.name) and _is_image_name(p.name)
    )
    names = [p.name for p in folders] if classes is None else classes
    files: list[str] = []
    labels: list[int] = []
    for class_folder in folders:
        if class_folder.name not in names:
            raise DataError(
                f"{class_folder}: class {class_folder.name!r} is not among the training classes ({', '.join(names)})"
            )
        images = _images_in(class_folder, scan)
        if not images:
            raise DataError(f"{class_folder}: class folder holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
        readable, problem = _first_readable(images)
        if readable is None:
            raise DataError(
                f"{class_folder}: none of its {len(images)} images can be read (e.g. {problem}); "
                "a class without a readable image cannot be learned"
            )
        files += images
        labels += [names.index(class_folder.name)] * len(images)
    return names, files, labels


def _channel_stats(data: ImageFolderData, seed: int, on_error: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean/std of the [0, 1]-scaled pixels of a seeded sample of training images.

    Raises:
        DataError: an image of the sample cannot be decoded (data.on_error=fail: naming the file and
            the split), or none can (skip).
    """
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randperm(len(data), generator=generator)[:_STATS_SAMPLES].tolist()
    images: list[torch.Tensor] = []
    unreadable: list[ImageDecodeError] = []
    for i in picks:
        try:
            images.append(decode_image(data.files[i], data.size))
        except ImageDecodeError as err:
            if on_error == "fail":
                raise DataError(
                    f"{err} (train split, sample {i}, read for data.normalize's statistics before training; "
                    f"{_SKIP_HINT})"
                ) from None
            unreadable.append(err)
    if not images:
        raise DataError(
            f"train split: none of the {len(picks)} images read for data.normalize's statistics can be decoded, "
            f"e.g. {unreadable[0]}"
        )
    if unreadable:
        log.warning(
            "train split: %d of the %d images read for the normalisation statistics are unreadable and left out "
            "(data.on_error=skip; training skips and counts them when it meets them), e.g. %s",
            len(unreadable),
            len(picks),
            unreadable[0],
        )
    pixels = torch.stack(images).transpose(0, 1).flatten(1).double() / 255.0
    mean, std = pixels.mean(dim=1), pixels.std(dim=1).clamp_min(1e-3)
    return tuple(mean.tolist()), tuple(std.tolist())


def _cap(data: ImageFolderData | None, limit: int | None) -> ImageFolderData | None:
    """At most `limit` samples, evenly spaced (fixed, so every evaluation sees the same ones)."""
    if data is None or limit is None or len(data) <= limit:
        return data
    return data.subset(np.linspace(0, len(data) - 1, limit).round().astype(int))


def _val_folder(root: Path) -> Path | None:
    found = [root / n for n in _VAL_NAMES if (root / n).is_dir()]
    if len(found) > 1:
        raise DataError(
            f"{root}: both {found[0].name}/ and {found[1].name}/ exist; keep one validation folder "
            "(otherwise one of them would be silently ignored)"
        )
    return found[0] if found else None


@register_data("image_folder")
def build_image_folder(config: DataConfig, seed: int) -> DataBundle:
    if config.path is None:
        raise ConfigError("data.path", "data.name=image_folder needs a folder with one sub-folder per class")
    check_data_path(config)
    root = Path(config.path)
    sides = [config.image_size] if isinstance(config.image_size, int) else config.image_size
    size = (sides[0], sides[-1])  # [height, width], or one side for a square
    scan = _Scan()
    val: ImageFolderData | None
    test: ImageFolderData | None
    if (root / "train").is_dir() and _subfolders(root / "train"):
        classes, files, labels = scan_classes(root / "train", scan=scan)
        train = ImageFolderData(files, labels, size)
        val_dir = _val_folder(root)
        val = ImageFolderData(*scan_classes(val_dir, classes, scan)[1:], size) if val_dir else None
        test = (
            ImageFolderData(*scan_classes(root / "test", classes, scan)[1:], size) if (root / "test").is_dir() else None
        )
    else:
        splits = [p.name for p in _subfolders(root) if p.name in _SPLIT_NAMES]
        if "train" in splits and len(splits) > 1:
            # train/ with images straight in it, beside val/ or test/: read as classes, these would
            # be classes named after the splits
            raise DataError(
                f"{root / 'train'}: no class folders; with {', '.join(s + '/' for s in splits)} as splits, "
                "each needs one sub-folder of images per class (train/<class>/...)"
            )
        classes, files, labels = scan_classes(root, scan=scan)
        everything = ImageFolderData(files, labels, size)
        train_idx, val_idx, test_idx = split_indices(len(files), config.val_fraction, config.test_fraction, seed)
        if len(train_idx) == 0:
            raise ConfigError(
                "data.val_fraction", f"leaves no training images out of {len(files)}", config.val_fraction
            )
        train = everything.subset(train_idx.tolist())
        val = everything.subset(val_idx.tolist()) if len(val_idx) else None
        test = everything.subset(test_idx.tolist()) if len(test_idx) else None
    if len(classes) < 2:
        raise DataError(f"{root}: one class folder ({classes[0]!r}); classification needs at least two classes")
    scan.warn()
    mean, std = _channel_stats(train, seed, config.on_error) if config.normalize else (None, None)
    spec = DataSpec(
        task="classification",
        input_shape=(3, *size),
        num_classes=len(classes),
        uint8_pixels=True,
        pixel_mean=mean,
        pixel_std=std,
        size_field="data.image_size",
    )
    return DataBundle(
        train=train, val=_cap(val, config.max_eval_samples), test=_cap(test, config.max_eval_samples), spec=spec
    )
