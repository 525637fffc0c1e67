"""image_folder on real PNG/JPEG files written here: layouts, decoding, statistics, bad folders."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.data.image_folder import ImageDecodeError, ImageFolderData
from gputrain.data.pixels import pixel_scaler
from gputrain.errors import DataError
from tests.unit.data.files import write_image_folder


def _build(path: Path, **fields: object):  # type: ignore[no-untyped-def]
    config = load_config({"data.name": "image_folder", "data.path": str(path),
                          **{f"data.{k}": v for k, v in fields.items()}})
    return build_data(config.data, seed=0)


def test_classes_splits_and_resized_rgb_tensors(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=3, per_class=10)
    bundle = _build(tmp_path, image_size=[12, 9], normalize=False, val_fraction=0.1, test_fraction=0.2)
    assert bundle.spec.num_classes == 3 and bundle.spec.input_shape == (3, 12, 9)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (21, 3, 6)
    image, label = bundle.train[0]
    assert image.shape == (3, 12, 9) and image.dtype == torch.uint8  # floats only on the device
    assert bundle.spec.uint8_pixels and bundle.spec.pixel_mean is None
    # class k is tinted towards channel k: the decoded pixels keep that
    assert image.float().mean(dim=(1, 2)).argmax().item() == label


def test_normalisation_uses_training_images_only(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=3, per_class=10)
    bundle = _build(tmp_path, image_size=8)
    scale = pixel_scaler(bundle.spec, torch.device("cpu"))
    assert scale is not None
    train = scale((torch.stack([bundle.train[i][0] for i in range(len(bundle.train))]), None))[0]
    assert train.dtype == torch.float32
    assert train.mean(dim=(0, 2, 3)).abs().max() < 1e-4  # all 21 train images are the statistics sample
    assert train.std(dim=(0, 2, 3)).sub(1).abs().max() < 1e-2
    test = scale((torch.stack([bundle.test[i][0] for i in range(len(bundle.test))]), None))[0]
    assert test.mean(dim=(0, 2, 3)).abs().max() > 1e-3  # the test split is scaled by the train statistics


def test_predefined_train_val_folders_are_the_splits(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "train", classes=2, per_class=6)
    write_image_folder(tmp_path / "val", classes=2, per_class=3, fmt="jpg")
    bundle = _build(tmp_path, image_size=8)
    assert (len(bundle.train), len(bundle.val), bundle.test) == (12, 6, None)
    assert all(f.endswith(".jpg") for f in bundle.val.files)


def test_grayscale_and_palette_images_become_rgb(tmp_path: Path) -> None:
    for k, mode in enumerate(("L", "P")):
        (tmp_path / f"c{k}").mkdir()
        Image.fromarray(np.full((10, 10), 120, dtype=np.uint8)).convert(mode).save(tmp_path / f"c{k}" / "a.png")
        Image.fromarray(np.full((7, 13), 60, dtype=np.uint8)).convert(mode).save(tmp_path / f"c{k}" / "b.png")
    bundle = _build(tmp_path, image_size=6, normalize=False, val_fraction=0.0, test_fraction=0.0)
    assert all(bundle.train[i][0].shape == (3, 6, 6) for i in range(4))


def test_max_eval_samples_caps_held_out_splits(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=20)
    bundle = _build(tmp_path, image_size=8, test_fraction=0.5, max_eval_samples=5)
    assert len(bundle.test) == 5 and len(bundle.train) == 16


def test_empty_class_folder_is_named(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=3)
    (tmp_path / "zebra").mkdir()
    (tmp_path / "zebra" / "notes.txt").write_text("no images here")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'zebra'}: class folder holds no images"):
        _build(tmp_path)


def test_folder_without_class_folders_and_unknown_val_class(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"^{tmp_path}: no class folders; image_folder expects one sub-folder"):
        _build(tmp_path)
    write_image_folder(tmp_path / "train", classes=2, per_class=3)
    write_image_folder(tmp_path / "val", classes=3, per_class=2)
    with pytest.raises(DataError, match=r"val/class_2: class 'class_2' is not among the training classes"):
        _build(tmp_path)


def test_corrupt_image_names_its_file(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=3)
    broken = tmp_path / "class_1" / "img_9.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n but not really")
    bundle = _build(tmp_path, image_size=8, normalize=False, val_fraction=0.0, test_fraction=0.0)
    index = bundle.train.files.index(str(broken))
    # a mid-run failure (exit 1 with the step), not bad input found before training (DataError, exit 2)
    with pytest.raises(ImageDecodeError, match=rf"^{broken}: cannot decode image: ") as raised:
        bundle.train[index]
    assert not isinstance(raised.value, DataError)  # unguarded, the trainer names the step and exits 1
    # decoded in a DataLoader worker, the error still reaches the user as one line naming the file
    with pytest.raises(ImageDecodeError) as err:
        list(DataLoader(bundle.train, batch_size=2, num_workers=1))
    assert re.fullmatch(rf"{broken}: cannot decode image: [^\n]+ \(in DataLoader worker process 0\)", str(err.value))


def test_decodes_in_dataloader_workers(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=4)
    train = _build(tmp_path, image_size=8, val_fraction=0.0, test_fraction=0.0).train
    assert isinstance(train, ImageFolderData)
    in_process = torch.stack([train[i][0] for i in range(8)])
    batches = list(DataLoader(train, batch_size=4, num_workers=1))
    torch.testing.assert_close(torch.cat([b[0] for b in batches]), in_process)


def test_uint8_images_reach_the_model_as_floats(tmp_path: Path) -> None:
    """image_folder (scaled and standardised from its spec) and a user's uint8 data set without a
    spec (scaled to [0, 1]) both train; the model never sees bytes."""
    from torch import nn
    from torch.utils.data import Dataset

    from gputrain import Trainer

    class Bytes(Dataset):
        def __len__(self) -> int:
            return 32

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return torch.full((3, 6, 6), 8 * i, dtype=torch.uint8), i % 2

    seen: list[torch.Tensor] = []

    def step_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        seen.append(batch[0])
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    config = {"train.device": "cpu", "train.max_steps": 2, "train.batch_size": 8, "log.progress": "none",
              "log.tensorboard": False, "checkpoint.enabled": False, "data.num_workers": 0}
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 2))
    Trainer(model, Bytes(), step_fn=step_fn, config=config, run_dir=tmp_path / "user").fit()
    assert seen and all(x.dtype == torch.float32 and 0.0 <= x.min() and x.max() <= 1.0 for x in seen)
    assert any(x.max() > 0.5 for x in seen)  # scaled, not zeroed

    write_image_folder(tmp_path / "images", classes=2, per_class=8)
    bundle = _build(tmp_path / "images", image_size=6)
    seen.clear()
    Trainer(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 2)), bundle.train, step_fn=step_fn,
            spec=bundle.spec, config=config, run_dir=tmp_path / "folder").fit()
    assert seen and all(x.dtype == torch.float32 and x.min() < 0 for x in seen)  # standardised around 0
