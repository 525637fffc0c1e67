"""On-device augmentation: correct crops and flips, drawn from the checkpointed torch RNG."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.data.augment import build_batch_transform, random_crop, random_flip
from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError


def test_every_crop_is_a_window_of_the_padded_image() -> None:
    torch.manual_seed(0)
    images = torch.randn(32, 3, 8, 8)
    out = random_crop(images, padding=2)
    padded = F.pad(images, (2, 2, 2, 2))
    offsets = set()
    for i in range(32):
        found = [(dy, dx) for dy in range(5) for dx in range(5)
                 if torch.equal(out[i], padded[i, :, dy:dy + 8, dx:dx + 8])]
        assert found, f"image {i} is not a crop"
        offsets.add(found[0])
    assert len(offsets) > 5  # offsets differ between images


def test_flip_mirrors_about_half() -> None:
    torch.manual_seed(0)
    images = torch.randn(64, 1, 4, 4)
    out = random_flip(images)
    flipped = [torch.equal(o, i.flip(2)) for o, i in zip(out, images)]
    assert all(f or torch.equal(o, i) for f, o, i in zip(flipped, out, images))
    assert 16 < sum(flipped) < 48


def test_transform_touches_images_only_and_follows_the_seed() -> None:
    transform = build_batch_transform(["crop", "flip"], channels_last=True)
    assert transform is not None
    batch = (torch.randn(8, 3, 16, 16), torch.arange(8))
    torch.manual_seed(1)
    a = transform(batch)
    torch.manual_seed(1)
    b = transform(batch)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], batch[1])
    assert a[0].is_contiguous(memory_format=torch.channels_last)
    tokens = (torch.randint(0, 9, (8, 16)), torch.arange(8))
    assert transform(tokens) is tokens  # not an image batch
    assert build_batch_transform([], channels_last=False) is None


def test_unknown_augmentation_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.augment=[\"crop\", \"rotate\"]"])
    assert str(err.value) == ("config error: data.augment = ['crop', 'rotate']: unknown augmentation 'rotate'; "
                              "choose from crop, flip")


def _train(run_dir: Path, epochs: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3))
    generator = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(64, 1, 8, 8, generator=generator), torch.randint(0, 3, (64,), generator=generator))
    config = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.epochs": epochs,
              "train.batch_size": 16, "data.augment": ["crop", "flip"], "model.dropout": 0.0}
    Trainer(model, data, config=config, run_dir=run_dir).fit()
    return load_file(str(run_dir / "model.safetensors"))


def test_resume_with_augmentation_is_bit_exact(tmp_path: Path) -> None:
    straight = _train(tmp_path / "straight", epochs=2)
    _train(tmp_path / "resumed", epochs=1)            # stops after epoch 1 (checkpoint written)
    resumed = _train(tmp_path / "resumed", epochs=2)  # continues from it
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    plain = _train(tmp_path / "again", epochs=2)
    assert all(torch.equal(straight[k], plain[k]) for k in straight)
