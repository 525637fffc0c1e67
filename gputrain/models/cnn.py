"""The classic MNIST-example CNN: convolutions, max-pool, dropout, two linear layers.

Adapted to the input: any channel count and image size. Small images (< 16 px) use padded
convolutions so an 8x8 digit keeps enough resolution for the pool.
"""

from __future__ import annotations

import torch
from torch import nn

from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.layers import make_activation
from gputrain.models.registry import register_model


class CNN(nn.Module):
    def __init__(
        self,
        in_shape: tuple[int, ...],
        channels: list[int],
        hidden: int,
        num_outputs: int,
        activation: str,
        conv_dropout: float,
        head_dropout: float,
    ) -> None:
        super().__init__()
        in_channels, height, width = in_shape
        padding = 1 if min(height, width) < 16 else 0
        layers: list[nn.Module] = []
        for out_channels in channels:
            layers += [nn.Conv2d(in_channels, out_channels, 3, padding=padding), make_activation(activation)]
            in_channels = out_channels
            height, width = height - 2 + 2 * padding, width - 2 + 2 * padding
        if min(height, width) < 2:
            raise ConfigError(
                "model.channels",
                f"{len(channels)} convolutions shrink a {in_shape[1]}x{in_shape[2]} "
                "image below 2x2; use fewer convolutions",
                channels,
            )
        layers += [nn.MaxPool2d(2), nn.Dropout(conv_dropout), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Linear(in_channels * (height // 2) * (width // 2), hidden),
            make_activation(activation),
            nn.Dropout(head_dropout),
            nn.Linear(hidden, num_outputs),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@register_model("cnn")
def build_cnn(config: ModelConfig, spec: DataSpec) -> nn.Module:
    if not spec.is_image:
        raise ConfigError(
            "model.name",
            f"cnn needs image data (channels, height, width); this data gives "
            f"samples of shape {list(spec.input_shape)}",
            config.name,
            hint="use model.name=mlp",
        )
    conv_dropout, head_dropout = (0.25, 0.5) if config.dropout is None else (config.dropout, config.dropout)
    return CNN(
        spec.input_shape,
        config.channels,
        config.hidden,
        spec.num_model_outputs,
        config.activation,
        conv_dropout,
        head_dropout,
    )
