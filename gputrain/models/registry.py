"""Model registry: `name -> builder(model_config, data_spec) -> nn.Module`.

Families register themselves with `@register_model("name")` in their own module; the modules
are listed in `_FAMILY_MODULES` and imported on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from torch import nn

from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec

ModelBuilder = Callable[[ModelConfig, DataSpec], nn.Module]
_MODELS: dict[str, ModelBuilder] = {}
_FAMILY_MODULES = ["gputrain.models.mlp", "gputrain.models.cnn", "gputrain.models.resnet", "gputrain.models.gpt"]


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    def decorate(builder: ModelBuilder) -> ModelBuilder:
        _MODELS[name] = builder
        return builder

    return decorate


def _load_families() -> None:
    for module in _FAMILY_MODULES:
        importlib.import_module(module)


def available_models() -> list[str]:
    _load_families()
    return sorted(_MODELS)


def build_model(config: ModelConfig, spec: DataSpec) -> nn.Module:
    """Build the configured model for this data and apply the configured init."""
    from gputrain.models.layers import apply_init

    _load_families()
    model = _MODELS[config.name](config, spec)
    apply_init(model, config.init, config.activation)
    return model
