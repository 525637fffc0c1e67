"""A `.npy` file read as samples, checked once before any of its values is used: every command that
takes an array of samples (predict's INPUT) reads it through `read_samples`.

What the file holds is decided from numpy's header alone, before the data is read:

- the file is a regular file holding a `.npy` array: not a `.npz` archive (a zip), a pickle or other bytes named `.npy`;
- its numbers are real: integers or floats of any width and byte order (big-endian is converted to
  the machine's order); Python objects (which only a pickle can hold, and a pickle can run code),
  complex numbers, booleans, text, dates and structured records are refused, naming what it holds;
- its shape is [N, *sample shape] with N >= 1, or one sample [*sample shape];
- the file holds the bytes its header declares (not truncated).

Then its values: finite, within the range of the dtype the samples are held in (float32: ±3.4e38;
uint8 pixels: whole numbers 0..255). Each refusal is one line naming the file, what it holds and what
would be right.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gputrain.errors import DataError

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_CHECK_VALUES = 1 << 22
"""Values checked at a time (whole samples): the check holds a float64 copy and masks of this many."""

_KINDS = {
    "b": "booleans",
    "c": "complex numbers",
    "U": "text",
    "S": "bytes (text)",
    "M": "dates",
    "m": "time spans",
    "V": "raw bytes",
    "O": "Python objects",
}


def read_samples(path: Path, sample_shape: tuple[int, ...], dtype: torch.dtype, expected: str) -> torch.Tensor:
    """The samples of the `.npy` file `path` as a [N, *sample_shape] tensor of `dtype` (module docstring).

    Args:
        expected: what the caller reads, in words, ending each refusal ("the model reads ...").

    Raises:
        DataError: one line naming the file, what it holds and `expected`.
    """
    shape, dtype_of_file = _header(path, expected)
    if len(shape) == 0:
        raise DataError(f"{path}: a single number (a 0-d array of {dtype_of_file}), not samples; {expected}")
    if shape == sample_shape:
        shape = (1, *shape)  # one sample
    if shape[1:] != sample_shape:
        raise DataError(f"{path}: an array of {dtype_of_file} {list(shape)}; {expected}")
    if shape[0] == 0:
        raise DataError(f"{path}: an array of 0 samples (shape {list(shape)}); it needs at least one; {expected}")
    try:
        array = np.load(path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError) as err:  # the header was read: the data is short or unreadable
        raise DataError(f"{path}: its data cannot be read ({str(err).strip()[:200]}); write it again") from None
    array = array.reshape(shape)
    _check_values(path, array, dtype, expected)
    native = array.dtype.newbyteorder("=")  # big-endian is converted: torch reads the machine's order
    return torch.from_numpy(np.array(array, dtype=native, order="C")).to(dtype)  # a copy off the mapped file


def _header(path: Path, expected: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from the header of `path`, its dtype checked (module docstring)."""
    if not path.is_file():  # a FIFO or a device would block the read or never end it
        raise DataError(f"{path}: not a regular file; save the samples with numpy.save; {expected}")
    try:
        with path.open("rb") as f:
            start = f.read(len(_NPY_MAGIC))
            if start.startswith(_ZIP_MAGIC):
                raise DataError(
                    f"{path}: a .npz archive (a zip of arrays), not one .npy array; save the samples with "
                    f"numpy.save; {expected}"
                )
            if start != _NPY_MAGIC:
                kind = "a pickle" if start[:1] == b"\x80" else "not a .npy array"
                raise DataError(f"{path}: {kind} (no numpy array header); save the samples with numpy.save; {expected}")
            f.seek(0)
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f, max_header_size=10000)  # Fortran order: np.load reads it as it is
            offset = f.tell()
        size = path.stat().st_size
    except OSError as err:
        raise DataError(f"{path}: cannot read: {err.strerror or err}") from None
    except ValueError as err:  # numpy's words for a damaged header
        raise DataError(f"{path}: a damaged .npy header ({str(err).strip()[:200]}); write the file again") from None
    if any(n < 0 for n in shape):
        raise DataError(f"{path}: a damaged .npy header (shape {list(shape)}); write the file again")
    if dtype.hasobject or dtype.names is not None or dtype.subdtype is not None or dtype.kind not in "iuf":
        if dtype.names is not None:
            what = f"structured records (fields {', '.join(dtype.names)})"
        elif dtype.subdtype is not None:
            what = f"sub-arrays of {dtype.subdtype[0]}"
        else:
            what = _KINDS.get(dtype.kind, str(dtype))
        raise DataError(f"{path}: an array of {what} ({dtype.str}); save plain numbers (int or float); {expected}")
    needed = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    if size - offset < needed:
        raise DataError(
            f"{path}: truncated: its header declares {dtype.str} {list(shape)} ({needed:,} bytes of data), the file "
            f"holds {max(0, size - offset):,}; write it again"
        )
    return tuple(int(n) for n in shape), dtype


def _check_values(path: Path, array: np.ndarray, dtype: torch.dtype, expected: str) -> None:
    """Every value finite and within `dtype`'s range (whole numbers for an integer dtype), checked
    _CHECK_VALUES at a time, as float64 (which holds every value of the dtypes read exactly enough to
    compare with the limits)."""
    if dtype.is_floating_point:
        limit = float(torch.finfo(dtype).max)
        low, high, whole = -limit, limit, False
    else:
        info = torch.iinfo(dtype)
        low, high, whole = float(info.min), float(info.max), True
    rows = max(1, _CHECK_VALUES // max(1, int(np.prod(array.shape[1:]))))
    for start in range(0, len(array), rows):
        chunk = np.asarray(array[start : start + rows], dtype=np.float64)
        finite = np.isfinite(chunk)
        bad = ~finite | (chunk < low) | (chunk > high)
        if whole:
            bad |= finite & (chunk != np.round(chunk))
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])  # within the chunk
            value = array[start + first[0]][first[1:]].item()
            name = str(dtype).removeprefix("torch.")
            rule = f"whole numbers {low:.0f}..{high:.0f}" if whole else f"finite numbers within ±{high:.2g}"
            raise DataError(
                f"{path}: sample {start + first[0]} holds {value!r} at {list(first[1:])}; the values must be {rule} "
                f"({name}); {expected}"
            )
