"""New inputs for `predict`, read into raw samples as the run's data source would give them (the
model's preprocessing is applied afterwards, by `Preprocessing.transform`):

- a CSV file, for a run trained on CSV data: its feature columns by name (use/tables.py);
- image files, or a folder of them (searched recursively), for a run trained on images: decoded and
  resized as the run's source does (image folders: RGB uint8, shorter side resized and centre-cropped;
  MNIST: grey in [0, 1]; digits: grey as whole counts 0..16, ink bright on dark as in scikit-learn's data);
- a `.npy` array of raw samples, [N, *input shape] or one sample, for any run that is not a language model.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from gputrain.data.arrays import read_samples
from gputrain.data.image_folder import IMAGE_SUFFIXES, ImageDecodeError, decode_image
from gputrain.errors import DataError, UsageError
from gputrain.use.preprocess import Preprocessing
from gputrain.use.tables import read_rows

_IMAGE_SOURCES = ("image_folder", "mnist", "digits")
_LUMA = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
"""ITU-R 601 luma, as Pillow's convert("L") weighs R, G, B."""


@dataclass(frozen=True, slots=True)
class InputBatch:
    """Some of the inputs, raw, with what identifies each one in the output (a file, a CSV line)."""

    names: list[str]
    raw: torch.Tensor


def read_inputs(path: Path, pre: Preprocessing, batch_size: int) -> Iterator[InputBatch]:
    """The inputs at `path` in batches of at most `batch_size`.

    Raises:
        UsageError (DataError): the inputs are not what the model reads: naming the expected columns,
            shape or kind of input.
    """
    if pre.task == "lm":
        raise UsageError("this run is a language model: predict scores rows and images; use gputrain generate")
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir() or path.suffix.lower() in IMAGE_SUFFIXES:
        yield from _images(path, pre, batch_size)
    elif path.suffix.lower() == ".csv":
        yield from _table(path, pre, batch_size)
    elif path.suffix.lower() == ".npy":
        yield from _array(path, pre, batch_size)
    else:
        raise UsageError(f"{path}: not an input predict reads; {expected_input(pre)}")


def expected_input(pre: Preprocessing) -> str:
    """What this run's model takes, in words, for messages."""
    shape = "x".join(map(str, pre.input_shape))
    if len(pre.input_shape) == 3:
        shape = f"{pre.input_shape[0]}-channel {pre.input_shape[1]}x{pre.input_shape[2]}"
    array = f"a .npy array of shape [N, {', '.join(map(str, pre.input_shape))}] ({pre.describe_input()['meaning']})"
    if pre.table is not None:
        return f"the model reads CSV rows with the columns {', '.join(pre.table.features)}, or {array}"
    if pre.source in _IMAGE_SOURCES:
        return f"the model reads {shape} images: image files, a folder of them, or {array}"
    return f"the model reads {array}"


def _table(path: Path, pre: Preprocessing, batch_size: int) -> Iterator[InputBatch]:
    if pre.table is None:
        raise UsageError(f"{path}: this run was not trained on CSV data; {expected_input(pre)}")
    lines, features, _ = read_rows(path, pre.table, need_labels=False)
    for start in range(0, len(lines), batch_size):
        chunk = slice(start, start + batch_size)
        yield InputBatch([f"line {n}" for n in lines[chunk]], features[chunk])


def _array(path: Path, pre: Preprocessing, batch_size: int) -> Iterator[InputBatch]:
    raw = read_samples(path, tuple(pre.input_shape), pre.raw_dtype, expected_input(pre))
    for start in range(0, len(raw), batch_size):
        yield InputBatch(
            [f"row {i}" for i in range(start, min(start + batch_size, len(raw)))], raw[start:][:batch_size]
        )


def _images(path: Path, pre: Preprocessing, batch_size: int) -> Iterator[InputBatch]:
    if pre.source not in _IMAGE_SOURCES:
        raise UsageError(f"{path}: images, but this run was not trained on images; {expected_input(pre)}")
    files = image_files(path)
    for start in range(0, len(files), batch_size):
        chunk = files[start : start + batch_size]
        yield InputBatch([str(f) for f in chunk], torch.stack([load_image(f, pre) for f in chunk]))


def image_files(path: Path) -> list[Path]:
    """`path` itself, or the image files in the folder `path` and its sub-folders (hidden ones left out), sorted.

    Raises:
        DataError: a folder without images.
    """
    if path.is_file():
        return [path]
    files = sorted(
        p
        for p in path.rglob("*")
        if p.is_file()
        and p.suffix.lower() in IMAGE_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    if not files:
        raise DataError(f"{path}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return files


def load_image(path: Path, pre: Preprocessing) -> torch.Tensor:
    """One image file as a raw sample of the run's source (module docstring).

    Raises:
        DataError: naming the file Pillow cannot decode.
    """
    channels, height, width = pre.input_shape
    try:
        rgb = decode_image(str(path), (height, width))
    except ImageDecodeError as err:
        raise DataError(str(err)) from None
    if pre.source == "image_folder":
        return rgb
    grey = (rgb.float() * _LUMA).sum(dim=0, keepdim=True).round()
    # MNIST: the very division data/mnist.py applies to its IDX bytes; digits are counts 0..16
    # (on-pixels of 4x4 blocks): the nearest count, as the data set holds them
    sample = grey / 255.0 if pre.source == "mnist" else (grey * 16 / 255).round()
    return sample.expand(channels, height, width).contiguous()
