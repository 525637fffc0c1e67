"""Pieces shared by the model families: activations by name and weight-init schemes."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from gputrain.models.meta import InitStep, run_init_steps

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "auto": nn.ReLU,  # model.activation=auto: relu for the convolutional/MLP families (gpt picks gelu itself)
    "relu": nn.ReLU,
    "leaky_relu": nn.LeakyReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
}
# The gain torch.nn.init uses for each activation (gelu/silu behave close to relu for init).
_GAIN_NAME: dict[str, Literal["relu", "leaky_relu", "tanh", "sigmoid"]] = {
    "auto": "relu",
    "relu": "relu",
    "leaky_relu": "leaky_relu",
    "gelu": "relu",
    "silu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
}


def make_activation(name: str) -> nn.Module:
    return _ACTIVATIONS[name]()


def _init_weight(weight: torch.Tensor, scheme: str, activation: str) -> None:
    nonlinearity = _GAIN_NAME[activation]
    if scheme == "constant":
        nn.init.constant_(weight, 0.01)
    elif scheme == "normal":
        nn.init.normal_(weight, std=0.02)
    elif scheme == "trunc_normal":
        nn.init.trunc_normal_(weight, std=0.02, a=-0.04, b=0.04)
    elif scheme == "xavier_uniform":
        nn.init.xavier_uniform_(weight, gain=nn.init.calculate_gain(nonlinearity))
    elif scheme == "xavier_normal":
        nn.init.xavier_normal_(weight, gain=nn.init.calculate_gain(nonlinearity))
    elif scheme in ("kaiming_uniform", "kaiming_normal"):
        # kaiming_* only know relu/leaky_relu; other activations get their gain through `a`-free "linear"
        mode_fn = nn.init.kaiming_uniform_ if scheme == "kaiming_uniform" else nn.init.kaiming_normal_
        mode_fn(weight, nonlinearity=nonlinearity if nonlinearity in ("relu", "leaky_relu") else "linear")
    elif scheme == "orthogonal":
        nn.init.orthogonal_(weight, gain=nn.init.calculate_gain(nonlinearity))
    else:
        raise ValueError(scheme)


def init_scheme_steps(model: nn.Module, scheme: str, activation: str) -> list[InitStep]:
    """`model.init` as init steps (models/meta.py): Linear/Conv weights by the scheme, biases zero;
    none for `default`, which keeps the layers' own init.

    `constant` fills 0.01, `normal`/`trunc_normal` use std 0.02 (GPT-2's choice), the others
    scale by the gain of the model's activation.
    """
    if scheme == "default":
        return []

    def fill(module: nn.Module) -> None:
        assert isinstance(module, _SCHEMED)  # the steps below name only these layers
        _init_weight(module.weight, scheme, activation)
        if module.bias is not None:
            nn.init.zeros_(module.bias)

    return [(name, fill) for name, module in model.named_modules() if isinstance(module, _SCHEMED)]


_SCHEMED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
"""The layers model.init's scheme fills."""


def apply_init(model: nn.Module, scheme: str, activation: str) -> None:
    """Re-initialise Linear/Conv weights (biases to zero) by `scheme`; `default` keeps torch's own init."""
    run_init_steps(model, init_scheme_steps(model, scheme, activation))


def num_features(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
