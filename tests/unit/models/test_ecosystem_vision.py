"""model.name=timm:<name> and torchvision:<name> with the real packages, on tiny images, for 1-2 steps.

Both skip where the package cannot be imported: timm needs torchvision, and PyPI's torchvision
wheels are built for PyPI's (CUDA) torch, so they do not import beside the CPU build of torch that
CI installs. The skip names the command that fixes it (`python3 scripts/install.py --ecosystem`
installs the torchvision built for the installed torch, where its index can be reached).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models import build_model
from gputrain.models.ecosystem import import_library


def _importable(module: str) -> Any:
    """The module, or a skip that says why it cannot be had and the command that fixes it: gputrain's
    own message (models/ecosystem.py), or this checkout's installer."""
    try:
        return import_library(module, f"{module}:x")
    except ConfigError as exc:
        pytest.skip(f"{' '.join(str(exc).split())} (or: {INSTALL})")


INSTALL = "python3 scripts/install.py --ecosystem"
"""What installs the libraries for the installed torch (the README's command; never `pip install
'gputrain[ecosystem]'`, which would replace a CPU torch with a CUDA one)."""


QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False}
DIGITS = DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10)


def _build(name: str, spec: DataSpec = DIGITS, **model: Any) -> nn.Module:
    config = load_config(None, {"model.name": name, **{f"model.{k}": v for k, v in model.items()}})
    return build_model(config.model, spec)


def _train_two_steps(name: str, tmp_path: Path) -> tuple[Trainer, dict[str, Any]]:
    overrides = {**QUIET, "model.name": name, "train.batch_size": 16, "train.max_steps": 2}
    trainer = Trainer.from_config(None, run_dir=tmp_path / "run", overrides=overrides, evaluate=False)
    return trainer, trainer.fit()


# ---------------------------------------------------------------- timm
def test_timm_resnet18_trains_on_the_digits(tmp_path: Path) -> None:
    timm = _importable("timm")
    trainer, summary = _train_two_steps("timm:resnet18", tmp_path)
    assert summary["status"] == "completed" and summary["global_step"] == 2
    model = trainer.model
    assert isinstance(model, timm.models.ResNet)
    assert model.conv1.in_channels == 1 and model.get_classifier().out_features == 10  # the data's, not ImageNet's
    assert summary["train"]["flops_per_step"] > 0


def test_timm_fixed_size_models_get_the_data_image_size() -> None:
    _importable("timm")
    spec = DataSpec(task="classification", input_shape=(3, 32, 32), num_classes=4)
    model = _build("timm:vit_tiny_patch16_224", spec)  # made for 224 px: built for 32, 2x2 patches
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 4)


def test_timm_unknown_name_suggests_its_own_names() -> None:
    _importable("timm")
    with pytest.raises(ConfigError, match=r"timm has no model 'resnt18' \(\d+ models\)\n  did you mean 'timm:resnet18"):
        _build("timm:resnt18")


def test_timm_model_too_big_for_the_images_is_refused_at_build() -> None:
    _importable("timm")
    with pytest.raises(ConfigError, match=r"cannot take this data's 1×8×8 images"):
        _build("timm:vit_tiny_patch16_224")  # 16 px patches on 8 px digits


def test_timm_local_weights_fine_tune_with_a_new_head(tmp_path: Path) -> None:
    timm = _importable("timm")
    torch.manual_seed(0)
    pretrained = timm.create_model("resnet18", pretrained=False, num_classes=1000, in_chans=1)  # "ImageNet" weights
    save_file(pretrained.state_dict(), str(tmp_path / "resnet18.safetensors"))
    model = _build("timm:resnet18", weights=str(tmp_path / "resnet18.safetensors"))
    assert torch.equal(model.conv1.weight, pretrained.conv1.weight)
    assert model.fc.weight.shape == (10, 512)  # sized for the digits' classes, left new


# ---------------------------------------------------------------- torchvision
def test_torchvision_mobilenet_trains_on_the_digits(tmp_path: Path) -> None:
    _importable("torchvision")
    trainer, summary = _train_two_steps("torchvision:mobilenet_v3_small", tmp_path)
    assert summary["status"] == "completed" and summary["global_step"] == 2
    first_conv = next(m for m in trainer.model.modules() if isinstance(m, nn.Conv2d))
    assert first_conv.in_channels == 1  # rebuilt for grey digits
    assert trainer.model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_torchvision_vit_gets_the_image_size_or_a_clear_refusal() -> None:
    _importable("torchvision")
    spec = DataSpec(task="classification", input_shape=(3, 32, 32), num_classes=4)
    assert _build("torchvision:vit_b_32", spec)(torch.randn(1, 3, 32, 32)).shape == (1, 4)
    with pytest.raises(ConfigError, match=r"torchvision cannot build it for this data's 1×8×8 images"):
        _build("torchvision:vit_b_16")


def test_torchvision_unknown_name_and_dropout() -> None:
    _importable("torchvision")
    with pytest.raises(ConfigError, match=r"torchvision has no model 'mobilenet_v4'"):
        _build("torchvision:mobilenet_v4")
    with pytest.raises(ConfigError, match=r"model.dropout = 0.2: torchvision's resnet18 has no dropout setting"):
        _build("torchvision:resnet18", dropout=0.2)
    model = _build("torchvision:mobilenet_v3_small", dropout=0.1)
    assert any(isinstance(m, nn.Dropout) and m.p == 0.1 for m in model.modules())
