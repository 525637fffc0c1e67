"""data/arrays.py: a `.npy` file is read as the samples it means, or refused from its header (kind of
file, dtype, shape, size) or its values (finite, within the held dtype) in one line naming the file."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gputrain.data import arrays
from gputrain.data.arrays import read_samples
from gputrain.errors import DataError

EXPECTED = "the model reads [N, 3]"


def _save(tmp_path: Path, array: np.ndarray, name: str = "x.npy") -> Path:
    path = tmp_path / name
    np.save(path, array, allow_pickle=True)
    return path


def _refused(path: Path, pattern: str, shape: tuple[int, ...] = (3,), dtype: torch.dtype = torch.float32) -> None:
    with pytest.raises(DataError) as err:
        read_samples(path, shape, dtype, EXPECTED)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    assert re.search(pattern, message), message


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=">f4").reshape(4, 3),  # big-endian: converted
        np.asfortranarray(np.arange(12, dtype=np.float64).reshape(4, 3)),
        np.arange(12, dtype=np.int64).reshape(4, 3),
        np.arange(12, dtype=">u2").reshape(4, 3),
        np.arange(12, dtype=np.float16).reshape(4, 3),
    ],
    ids=["big-endian", "fortran-float64", "int64", "big-endian-uint16", "float16"],
)
def test_real_numbers_of_any_width_and_order_read_as_the_same_samples(tmp_path: Path, array: np.ndarray) -> None:
    got = read_samples(_save(tmp_path, array), (3,), torch.float32, EXPECTED)
    assert got.dtype == torch.float32 and got.is_contiguous()
    torch.testing.assert_close(got, torch.arange(12, dtype=torch.float32).view(4, 3))


def test_one_sample_is_a_batch_of_one(tmp_path: Path) -> None:
    got = read_samples(_save(tmp_path, np.array([1.0, 2.0, 3.0])), (3,), torch.float32, EXPECTED)
    assert got.tolist() == [[1.0, 2.0, 3.0]]


def test_uint8_pixels_read_from_whole_floats(tmp_path: Path) -> None:
    got = read_samples(_save(tmp_path, np.array([[0.0, 128.0, 255.0]])), (3,), torch.uint8, EXPECTED)
    assert got.dtype == torch.uint8 and got.tolist() == [[0, 128, 255]]


@pytest.mark.parametrize(
    ("array", "pattern"),
    [
        (np.ones((2, 3), dtype=np.complex64), r"an array of complex numbers \(<c8\); save plain numbers"),
        (np.array([[1, 2, 3]], dtype=object), r"an array of Python objects \(\|O\)"),
        (np.array([["a", "b", "c"]]), r"an array of text \(<U1\)"),
        (np.array([[b"a", b"b", b"c"]]), r"an array of bytes \(text\)"),
        (np.ones((2, 3), dtype=bool), r"an array of booleans"),
        (np.zeros((2, 3), dtype="datetime64[s]"), r"an array of dates"),
        (np.zeros(2, dtype=[("a", "f4"), ("b", "f4"), ("c", "f4")]), r"structured records \(fields a, b, c\)"),
        (np.array(1.0), r"a single number \(a 0-d array of float64\), not samples"),
        (np.ones((0, 3), dtype=np.float32), r"an array of 0 samples \(shape \[0, 3\]\); it needs at least one"),
        (np.ones((2, 3, 1), dtype=np.float32), r"an array of float32 \[2, 3, 1\]; the model reads \[N, 3\]"),
        (np.ones((2, 5), dtype=np.float32), r"an array of float32 \[2, 5\]; the model reads \[N, 3\]"),
        (np.ones((0,), dtype=np.float32), r"an array of float32 \[0\]"),
        (np.array([[1, np.nan, 3]], dtype=np.float32), r"sample 0 holds nan at \[1\]; the values must be finite"),
        (np.array([[1, 2, 3], [1, 2, -np.inf]]), r"sample 1 holds -inf at \[2\]; the values must be finite"),
        (np.array([[1, 2, 1e300]]), r"sample 0 holds 1e\+300 at \[2\]; .* within ±3.4e\+38 \(float32\)"),
    ],
    ids=[
        "complex",
        "object",
        "text",
        "bytes",
        "bool",
        "datetime",
        "structured",
        "0-d",
        "zero-rows",
        "3-d",
        "wrong-width",
        "empty-1-d",
        "nan",
        "-inf",
        "beyond-float32",
    ],
)
def test_arrays_that_are_not_samples_are_refused_in_one_line(tmp_path: Path, array: np.ndarray, pattern: str) -> None:
    _refused(_save(tmp_path, array), pattern + (".*; the model reads" if "model reads" not in pattern else ""))


@pytest.mark.parametrize(
    ("array", "pattern"),
    [
        (np.array([[0, 256, 3]]), r"sample 0 holds 256 at \[1\]; the values must be whole numbers 0..255 \(uint8\)"),
        (np.array([[0, -1, 3]], dtype=np.int8), r"sample 0 holds -1 at \[1\]"),
        (np.array([[0.5, 1, 3]]), r"sample 0 holds 0.5 at \[0\]; the values must be whole numbers"),
        (np.array([[np.nan, 1, 3]]), r"sample 0 holds nan at \[0\]"),
    ],
    ids=["above-255", "negative", "fraction", "nan"],
)
def test_pixels_are_whole_numbers_within_uint8(tmp_path: Path, array: np.ndarray, pattern: str) -> None:
    _refused(_save(tmp_path, array), pattern, dtype=torch.uint8)


def test_a_bad_value_is_found_past_the_first_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrays, "_CHECK_VALUES", 12)  # 4 samples of 3
    array = np.zeros((10, 3), dtype=np.float32)
    array[9, 2] = np.inf
    _refused(_save(tmp_path, array), r"sample 9 holds inf at \[2\]")


def test_files_that_are_not_npy_arrays_are_named_for_what_they_are(tmp_path: Path) -> None:
    npz = tmp_path / "a.npy"
    with npz.open("wb") as f:
        np.savez(f, a=np.ones(3))
    _refused(npz, r"a .npz archive \(a zip of arrays\), not one .npy array; save the samples with numpy.save")
    pickled = tmp_path / "p.npy"
    pickled.write_bytes(pickle.dumps([[1.0, 2.0, 3.0]]))
    _refused(pickled, r"a pickle \(no numpy array header\)")
    text = tmp_path / "t.npy"
    text.write_text("1,2,3\n")
    _refused(text, r"not a .npy array \(no numpy array header\)")
    empty = tmp_path / "e.npy"
    empty.write_bytes(b"")
    _refused(empty, r"not a .npy array")


def test_a_damaged_or_truncated_file_is_refused_before_its_data_is_read(tmp_path: Path) -> None:
    path = _save(tmp_path, np.ones((100, 3), dtype=np.float32))
    data = path.read_bytes()
    path.write_bytes(data[:-8])
    _refused(path, r"truncated: its header declares <f4 \[100, 3\] \(1,200 bytes of data\), the file holds 1,192")
    path.write_bytes(data[:20])
    _refused(path, r"a damaged .npy header")
    path.write_bytes(data.replace(b"'descr'", b"'dascr'", 1))
    _refused(path, r"a damaged .npy header")
    path.write_bytes(data.replace(b"(100, 3)", b"(-10, 3)", 1))
    _refused(path, r"a damaged .npy header \(shape \[-10, 3\]\)")


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "x.npy"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    _refused(fifo, r"not a regular file")
    _refused(tmp_path, r"not a regular file")
