"""MNIST from real IDX files written here: the loader, the splits, and every bad-file message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.errors import ConfigError, DataError
from tests.unit.data.files import mnist_like, write_idx, write_mnist

ROOT = Path(__file__).resolve().parents[3]


def _build(path: Path, **fields: object):  # type: ignore[no-untyped-def]
    config = load_config({"data.name": "mnist", "data.path": str(path), **{f"data.{k}": v for k, v in fields.items()}})
    return build_data(config.data, seed=0)


@pytest.mark.parametrize("gz", [False, True])
def test_reads_the_four_files_into_train_val_and_test(tmp_path: Path, gz: bool) -> None:
    write_mnist(tmp_path, n_train=100, n_test=30, gz=gz)
    bundle = _build(tmp_path, val_fraction=0.2, normalize=False)
    assert bundle.spec.input_shape == (1, 28, 28) and bundle.spec.num_classes == 10
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (80, 20, 30)  # t10k is the test split
    images, labels = mnist_like(30, seed=1)
    torch.testing.assert_close(bundle.test.inputs[:, 0], torch.from_numpy(images).float() / 255)
    assert torch.equal(bundle.test.targets, torch.from_numpy(labels).long())


def test_normalises_with_training_statistics_and_finds_raw_subfolder(tmp_path: Path) -> None:
    write_mnist(tmp_path / "raw", n_train=100, n_test=30)  # torchvision's MNIST/raw layout
    bundle = _build(tmp_path)
    assert bundle.train.inputs.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert bundle.train.inputs.std().item() == pytest.approx(1.0, abs=1e-4)
    assert abs(bundle.test.inputs.mean().item()) < 0.2  # same transform, not its own statistics


def test_missing_file_says_which_and_where_to_get_it(tmp_path: Path) -> None:
    write_mnist(tmp_path, n_train=20, n_test=10)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError) as err:
        _build(tmp_path)
    message = str(err.value)
    assert message.startswith(f"data.path: t10k-labels-idx1-ubyte (or t10k-labels-idx1-ubyte.gz) not found in "
                              f"{tmp_path}; download it from MNIST: https://")
    assert "fashion-mnist" in message


def test_wrong_magic_number_names_the_file(tmp_path: Path) -> None:
    write_mnist(tmp_path, n_train=20, n_test=10)
    images, _ = mnist_like(20, seed=0)
    bad = write_idx(tmp_path / "train-images-idx3-ubyte", images, magic=0x00000801)
    with pytest.raises(DataError, match=rf"^{bad}: not an IDX file of 3-d unsigned bytes: magic number 0x00000801, "
                                        r"expected 0x00000803$"):
        _build(tmp_path)


def test_truncated_and_mismatched_files_name_the_file(tmp_path: Path) -> None:
    write_mnist(tmp_path, n_train=20, n_test=10)
    images = tmp_path / "train-images-idx3-ubyte"
    full = 16 + 20 * 28 * 28
    images.write_bytes(images.read_bytes()[:-5])
    with pytest.raises(DataError, match=rf"^{images}: {full - 5} bytes, but its header \(20 x 28 x 28\) needs {full}$"):
        _build(tmp_path)
    write_mnist(tmp_path, n_train=20, n_test=10)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(19, dtype=np.uint8))
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte: 19 labels for the 20 images of"):
        _build(tmp_path)


def test_path_must_be_given_and_be_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="data.path: data.name=mnist needs the folder holding the IDX files"):
        build_data(load_config({"data.name": "mnist"}).data, seed=0)
    with pytest.raises(DataError, match=f"data.path: no such folder: {tmp_path / 'nope'}"):
        _build(tmp_path / "nope")


def test_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gputrain", "train", "data.name=mnist", f"data.path={tmp_path}",
                             "--run-dir", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "train-images-idx3-ubyte (or train-images-idx3-ubyte.gz) not found" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 2
