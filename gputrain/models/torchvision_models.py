"""`model.name=torchvision:<name>`: torchvision's classification models, sized for the data.

torchvision sizes the head (`num_classes`) itself; its models take 3 channels, so for other images
the first convolution, the only layer that sees the channels, is rebuilt for the data's count.
Models made for one input size get the data's: ViTs take `image_size` (square images) and MaxViT
`input_size`. Weights start random (`weights=None`: never downloaded); pretrained ones come from a
local file through `model.weights`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.ecosystem import (
    check_image_data,
    check_known_name,
    check_takes_images,
    import_library,
    larger_images_hint,
)
from gputrain.models.registry import register_library

# In training these add auxiliary classifiers whose outputs come back beside the logits: the loop
# trains on one output, so they are left out (torchvision's own fine-tuning recipe can use them).
_AUX_LOGITS = ("googlenet", "inception_v3")


def _size_options(name: str, spec: DataSpec) -> dict[str, Any]:
    height, width = spec.input_shape[1:]
    if name.startswith("vit_") and height == width:
        return {"image_size": height}
    if name.startswith("maxvit_"):
        return {"input_size": (height, width)}
    return {}


def _set_input_channels(model: nn.Module, channels: int) -> None:
    """Replace the first convolution (in every torchvision classification model, the one that reads
    the image) with one of the same shape that reads `channels` channels."""
    name, first = next((n, m) for n, m in model.named_modules() if isinstance(m, nn.Conv2d))
    if first.in_channels == channels:
        return
    parent_name, _, child_name = name.rpartition(".")
    replacement = nn.Conv2d(
        channels,
        first.out_channels,
        _two(first.kernel_size),
        stride=_two(first.stride),
        padding=first.padding if isinstance(first.padding, str) else _two(first.padding),
        dilation=_two(first.dilation),
        bias=first.bias is not None,
        padding_mode=first.padding_mode,
    )
    setattr(model.get_submodule(parent_name), child_name, replacement)


def _two(values: tuple[int, ...]) -> tuple[int, int]:
    """A Conv2d's setting per spatial dimension (height, width), as its constructor takes it."""
    height, width = values
    return height, width


@register_library("torchvision")
def build_torchvision_model(name: str, config: ModelConfig, spec: DataSpec) -> nn.Module:
    """Raises ConfigError: torchvision is missing, has no such model, or the model cannot take the data."""
    channels = check_image_data(spec, config.name)
    torchvision = import_library("torchvision", config.name)
    models = torchvision.models
    check_known_name(name, models.list_models(module=models), config.name, "torchvision")
    options: dict[str, Any] = {"weights": None, "num_classes": spec.num_model_outputs, **_size_options(name, spec)}
    if name in _AUX_LOGITS:
        options.update(aux_logits=False, init_weights=True)
    if config.dropout is not None:
        options["dropout"] = config.dropout
    try:
        model: nn.Module = models.get_model(name, **options)
    except TypeError as exc:  # an option this model does not have: only dropout can be the user's
        if config.dropout is None:
            raise
        raise ConfigError(
            "model.dropout", f"torchvision's {name} has no dropout setting", config.dropout, hint="leave it unset"
        ) from exc
    except (AssertionError, ValueError, RuntimeError) as exc:  # e.g. a ViT whose patches do not tile the image
        raise ConfigError(
            "model.name",
            f"torchvision cannot build it for this data's {'×'.join(map(str, spec.input_shape))} images: {exc}",
            config.name,
            hint=larger_images_hint(spec),
        ) from exc
    _set_input_channels(model, channels)
    check_takes_images(model, spec, config.name)
    return model
