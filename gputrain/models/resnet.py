"""ResNet-18/34/50 (He et al. 2015), written here so torchvision is not a dependency.

Layer for layer the torchvision v1.5 models (stride on the 3x3 convolution of a bottleneck), so
resnet50 with 1000 classes has the published 25,557,032 parameters. Any channel count and image
size: images under 64 px get a 3x3 stride-1 stem without max-pool (the CIFAR variant), so an 8x8
digit or a 28x28 MNIST image is not pooled away before the first block.
"""

from __future__ import annotations

import torch
from torch import nn

from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.layers import make_activation
from gputrain.models.meta import InitStep, run_init_steps
from gputrain.models.registry import register_model

# Images smaller than this (shorter side) use the small stem.
_SMALL_STEM_BELOW = 64


class BasicBlock(nn.Module):
    """Two 3x3 convolutions (ResNet-18/34)."""

    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int, activation: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.act = make_activation(activation)
        self.downsample = _shortcut(in_ch, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4 (ResNet-50)."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, activation: str) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.act = make_activation(activation)
        self.downsample = _shortcut(in_ch, out_ch, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        out = self.act(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.act(out + (x if self.downsample is None else self.downsample(x)))


def _shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Module | None:
    """Projection (1x1 conv + BN) where the block changes shape; identity (None) otherwise."""
    if stride == 1 and in_ch == out_ch:
        return None
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))


def _conv_init(module: nn.Module) -> None:
    assert isinstance(module, nn.Conv2d)
    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")


def _bn_init(module: nn.Module) -> None:
    assert isinstance(module, nn.BatchNorm2d)
    nn.init.ones_(module.weight)
    nn.init.zeros_(module.bias)


class ResNet(nn.Module):
    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        depths: list[int],
        in_shape: tuple[int, ...],
        num_outputs: int,
        activation: str,
        dropout: float,
        base_width: int = 64,
    ) -> None:
        super().__init__()
        in_channels, height, width = in_shape
        if min(height, width) < _SMALL_STEM_BELOW:
            stem: list[nn.Module] = [
                nn.Conv2d(in_channels, base_width, 3, padding=1, bias=False),
                nn.BatchNorm2d(base_width),
                make_activation(activation),
            ]
        else:
            stem = [
                nn.Conv2d(in_channels, base_width, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(base_width),
                make_activation(activation),
                nn.MaxPool2d(3, stride=2, padding=1),
            ]
        self.stem = nn.Sequential(*stem)
        stages: list[nn.Module] = []
        ch = base_width
        for i, depth in enumerate(depths):
            width_i = base_width * 2**i
            blocks = []
            for j in range(depth):
                blocks.append(block(ch, width_i, 2 if (i > 0 and j == 0) else 1, activation))
                ch = width_i * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        # adaptive pooling makes the head independent of the input size
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(ch, num_outputs)
        run_init_steps(self, self.init_steps())

    def init_steps(self) -> list[InitStep]:
        """torchvision's init as init steps (models/meta.py): He (fan_out) for convolutions, BN scale 1
        and shift 0."""
        return [
            (name, _conv_init if isinstance(m, nn.Conv2d) else _bn_init)
            for name, m in self.named_modules()
            if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(self.dropout(torch.flatten(self.pool(x), 1)))


_VARIANTS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], list[int]]] = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}


def build_resnet(variant: str, config: ModelConfig, spec: DataSpec) -> ResNet:
    if not spec.is_image:
        raise ConfigError(
            "model.name",
            f"{variant} needs image data (channels, height, width); this data gives "
            f"samples of shape {list(spec.input_shape)}",
            config.name,
            hint="use model.name=mlp",
        )
    block, depths = _VARIANTS[variant]
    return ResNet(
        block,
        depths,
        spec.input_shape,
        spec.num_model_outputs,
        config.activation,
        config.dropout or 0.0,
        config.base_width,
    )


def _register(variant: str) -> None:
    @register_model(variant)
    def build(config: ModelConfig, spec: DataSpec) -> nn.Module:
        return build_resnet(variant, config, spec)


for _name in _VARIANTS:
    _register(_name)
