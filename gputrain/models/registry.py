"""Model registry: `name -> builder(model_config, data_spec) -> nn.Module`.

Families register themselves with `@register_model("name")` in their own module; the modules
are listed in `MODELS` and imported on first use. A built-in name is also listed in
`gputrain.config.names.MODEL_NAMES`, which the config validates against without importing this.

Models of outside libraries are named `<library>:<name>` (`timm:resnet18`); each library's builder
registers with `@register_library("timm")` and gets the name after the colon. `model.weights` is
loaded into whatever was built (gputrain/models/weights.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from gputrain.config.names import add_choice
from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.registry import Registry

ModelBuilder = Callable[[ModelConfig, DataSpec], nn.Module]
MODELS: Registry[ModelBuilder] = Registry(
    [
        "gputrain.models.mlp",
        "gputrain.models.cnn",
        "gputrain.models.resnet",
        "gputrain.models.gpt",
        "gputrain.models.hf_models",
    ]
)
LibraryBuilder = Callable[[str, ModelConfig, DataSpec], nn.Module]
"""builder(name within the library, model config, data spec) -> the model."""
LIBRARIES: Registry[LibraryBuilder] = Registry(["gputrain.models.timm_models", "gputrain.models.torchvision_models"])


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Decorator: add a model family under `name`; the config accepts `model.name=name` from now on."""
    add_choice("model.name", name)
    return MODELS.register(name)


def register_library(library: str) -> Callable[[LibraryBuilder], LibraryBuilder]:
    """Decorator: build `model.name=<library>:<name>`; the library must be listed in
    `gputrain.config.names.MODEL_LIBRARIES`, where the config checks the form without importing this."""
    return LIBRARIES.register(library)


def available_models() -> list[str]:
    return MODELS.names()


# The families whose whole init is their layers' reset_parameters, their own `init_steps` and
# `model.init`: built on the meta device, they materialise with the eager build's values (models/meta.py).
META_FAMILIES = frozenset({"mlp", "cnn", "resnet18", "resnet34", "resnet50", "gpt"})


def build_model(config: ModelConfig, spec: DataSpec, *, on_meta: bool = False) -> nn.Module:
    """Build the configured model for this data, apply the configured init, then load `model.weights`.

    Args:
        on_meta: build a built-in family without weights on the meta device, to be parallelised
            and then materialised rank by rank (models/meta.py) with the values an eager build gives
            for the same generator state; any other model is built as usual.

    Raises:
        ConfigError: the model does not fit the data, its library is missing or lacks the name, or
            the weights do not fit the model.
    """
    from gputrain.models.layers import apply_init, init_scheme_steps
    from gputrain.models.meta import record_deferred
    from gputrain.models.weights import load_weights

    if on_meta and config.name in META_FAMILIES and config.weights is None:
        rng_state = torch.get_rng_state()  # where the eager build would begin drawing
        with torch.device("meta"):
            model = MODELS[config.name](config, spec)
        record_deferred(model, rng_state, init_scheme_steps(model, config.init, config.activation))
        return model
    library, colon, name = config.name.partition(":")
    model = LIBRARIES[library](name, config, spec) if colon else MODELS[config.name](config, spec)
    apply_init(model, config.init, config.activation)
    if config.weights is not None:  # after the init, which would overwrite them
        load_weights(model, config.weights)
    return model
