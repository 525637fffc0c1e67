"""ResNet-18/34/50: published sizes, both stems, any channel count, channels_last."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models import build_model


def _build(name: str, shape: tuple[int, ...], classes: int = 10, device: str = "cpu", **extra: object) -> nn.Module:
    config = load_config({"model.name": name, **{f"model.{k}": v for k, v in extra.items()}})
    with torch.device(device):
        return build_model(config.model, DataSpec(task="classification", input_shape=shape, num_classes=classes))


@pytest.mark.parametrize(("name", "params"), [("resnet18", 11_689_512), ("resnet34", 21_797_672),
                                              ("resnet50", 25_557_032)])
def test_published_parameter_counts(name: str, params: int) -> None:
    # torchvision's counts for 3x224x224 inputs and 1000 classes; built on meta, so nothing is allocated
    model = _build(name, (3, 224, 224), classes=1000, device="meta")
    assert sum(p.numel() for p in model.parameters()) == params


def test_stem_follows_the_image_size() -> None:
    small = _build("resnet18", (1, 28, 28), base_width=8)
    large = _build("resnet18", (3, 96, 80), base_width=8)
    assert small.stem[0].kernel_size == (3, 3) and small.stem[0].stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in small.stem)
    assert large.stem[0].kernel_size == (7, 7) and isinstance(large.stem[-1], nn.MaxPool2d)
    assert small(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert large(torch.randn(2, 3, 96, 80)).shape == (2, 10)


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_channels_last_gives_the_same_outputs(name: str) -> None:
    torch.manual_seed(0)
    model = _build(name, (5, 8, 8), classes=4, base_width=8).eval()
    x = torch.randn(3, 5, 8, 8)
    expected = model(x)
    out = model.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_activation_and_dropout_options_apply() -> None:
    model = _build("resnet34", (3, 8, 8), activation="silu", dropout=0.3, base_width=8)
    assert any(isinstance(m, nn.SiLU) for m in model.modules())
    assert not any(isinstance(m, nn.ReLU) for m in model.modules())
    assert model.dropout.p == 0.3


def test_non_image_data_is_a_config_error() -> None:
    config = load_config({"model.name": "resnet18"})
    with pytest.raises(ConfigError, match=r"model.name = 'resnet18': resnet18 needs image data .* shape \[12\]"):
        build_model(config.model, DataSpec(task="classification", input_shape=(12,), num_classes=2))
