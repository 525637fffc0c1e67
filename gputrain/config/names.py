"""The names `model.name`, `data.name` and `rl.env` choose from, so a config is checked without torch.

The registries (`gputrain.models.registry`, `gputrain.data.registry`) import torch and the
config schema; validation reads these lists instead, so `gputrain.config` imports neither.
tests/unit/config/test_names.py keeps them equal to what the registries hold: a new built-in
model or data source is listed here as well as registered.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["DATA_NAMES", "ENV_ACTIONS", "MODEL_LIBRARIES", "MODEL_NAMES", "ActionKind", "add_choice", "choices"]

NameField = Literal["model.name", "data.name"]

MODEL_NAMES: tuple[str, ...] = ("cnn", "gpt", "hf", "mlp", "resnet18", "resnet34", "resnet50")
"""Built-in model families: `@register_model(...)` in gputrain/models/{mlp,cnn,resnet,gpt,hf_models}.py."""
MODEL_LIBRARIES: tuple[str, ...] = ("timm", "torchvision")
"""Outside libraries whose models `model.name=<library>:<name>` builds (`@register_library(...)` in
gputrain/models/{timm,torchvision}_models.py). Only the form is checked here: which names a library
has is known once it is imported, so the name itself is checked when the model is built."""
DATA_NAMES: tuple[str, ...] = (
    "csv",
    "digits",
    "image_folder",
    "instructions",
    "mnist",
    "synthetic",
    "text",
    "text_classes",
    "tokens",
)
"""Built-in data sources: `@register_data(...)` in the modules gputrain/data/registry.py lists."""

ActionKind = Literal["discrete", "continuous"]
ENV_ACTIONS: dict[str, ActionKind] = {
    "Acrobot-v1": "discrete",
    "CartPole-v1": "discrete",
    "MountainCar-v0": "discrete",
    "Pendulum-v1": "continuous",
}
"""The tensor environments (`gputrain.rl.envs.registry`, gymnasium's ids) and their kind of action:
the kind decides the policy and the CleanRL defaults that `auto` takes (config/schema.py, RLConfig)."""

_BUILT_IN: dict[NameField, tuple[str, ...]] = {"model.name": MODEL_NAMES, "data.name": DATA_NAMES}
_added: dict[NameField, set[str]] = {"model.name": set(), "data.name": set()}


def add_choice(field: NameField, name: str) -> None:
    """Accept `name` for `field` from now on: `register_model`/`register_data` call this, so a
    family a user registers at run time validates like a built-in one."""
    _added[field].add(name)


def choices(field: NameField) -> list[str]:
    """The names `field` accepts, sorted (the order error messages list them in)."""
    return sorted({*_BUILT_IN[field], *_added[field]})
