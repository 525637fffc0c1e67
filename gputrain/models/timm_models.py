"""`model.name=timm:<name>`: any of timm's image models, sized for the data.

timm builds the input layer for the data's channels (`in_chans`) and the head for its classes
(`num_classes`); models made for one input size (ViT, Swin: timm marks them `fixed_input_size`) get
the data's image size as `img_size`. Weights start random (`pretrained=False`: never downloaded);
pretrained ones come from a local file through `model.weights`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.ecosystem import check_image_data, check_known_name, check_takes_images, import_library
from gputrain.models.registry import register_library


@register_library("timm")
def build_timm_model(name: str, config: ModelConfig, spec: DataSpec) -> nn.Module:
    """Raises ConfigError: timm is missing, has no such model, or the model cannot take the data."""
    in_chans = check_image_data(spec, config.name)
    timm = import_library("timm", config.name)
    # a pretrained tag (resnet18.a1_in1k) names the same architecture: timm checks it without the tag
    if not timm.is_model(name):
        check_known_name(name, timm.list_models(), config.name, "timm")
    options: dict[str, Any] = {"num_classes": spec.num_model_outputs, "in_chans": in_chans}
    pretrained_cfg = timm.models.get_pretrained_cfg(name)
    if pretrained_cfg is not None and pretrained_cfg.fixed_input_size:
        options["img_size"] = tuple(spec.input_shape[1:])
    if config.dropout is not None:
        options["drop_rate"] = config.dropout
    try:
        model: nn.Module = timm.create_model(name, pretrained=False, **options)
    except (RuntimeError, TypeError, ValueError) as exc:  # a bad pretrained tag, an option the model lacks
        raise ConfigError("model.name", f"timm cannot build it: {exc}", config.name) from exc
    check_takes_images(model, spec, config.name)
    return model
