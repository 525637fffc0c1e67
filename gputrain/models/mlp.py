"""Multi-layer perceptron over flattened inputs."""

from __future__ import annotations

from torch import nn

from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.layers import make_activation, num_features
from gputrain.models.registry import register_model


class MLP(nn.Sequential):
    def __init__(self, in_features: int, hidden_sizes: list[int], out_features: int, activation: str,
                 dropout: float) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), make_activation(activation)]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)


@register_model("mlp")
def build_mlp(config: ModelConfig, spec: DataSpec) -> nn.Module:
    if spec.task == "lm":
        raise ConfigError("model.name", "mlp cannot model token sequences; use a language model such as gpt",
                          config.name)
    return MLP(num_features(spec.input_shape), config.hidden_sizes, spec.num_model_outputs, config.activation,
               config.dropout or 0.0)
