"""Model registry: `name -> builder(model_config, data_spec) -> nn.Module`.

Families register themselves with `@register_model("name")` in their own module; the modules
are listed in `MODELS` and imported on first use. A built-in name is also listed in
`gputrain.config.names.MODEL_NAMES`, which the config validates against without importing this.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from gputrain.config.names import add_choice
from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.registry import Registry

ModelBuilder = Callable[[ModelConfig, DataSpec], nn.Module]
MODELS: Registry[ModelBuilder] = Registry(
    ["gputrain.models.mlp", "gputrain.models.cnn", "gputrain.models.resnet", "gputrain.models.gpt"]
)


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Decorator: add a model family under `name`; the config accepts `model.name=name` from now on."""
    add_choice("model.name", name)
    return MODELS.register(name)


def available_models() -> list[str]:
    return MODELS.names()


def build_model(config: ModelConfig, spec: DataSpec) -> nn.Module:
    """Build the configured model for this data and apply the configured init."""
    from gputrain.models.layers import apply_init

    model = MODELS[config.name](config, spec)
    apply_init(model, config.init, config.activation)
    return model
