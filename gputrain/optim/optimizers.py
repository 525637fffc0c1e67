"""Optimizers by name, using torch's fused or foreach kernels where the device has them."""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch

from gputrain.config.schema import OptimConfig

_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad, "adadelta": torch.optim.Adadelta, "adamax": torch.optim.Adamax,
    "nadam": torch.optim.NAdam,
}


def effective_lr(config: OptimConfig, batch_size: int) -> float:
    """The peak LR, with the linear scaling rule applied when asked for."""
    if config.scale_lr == "linear":
        return config.lr * batch_size / config.base_batch_size
    return config.lr


def _kernel_flags(cls: type[torch.optim.Optimizer], device: torch.device) -> dict[str, bool]:
    """fused on CUDA when the optimizer has it (one kernel for all parameters), else foreach."""
    accepted = inspect.signature(cls.__init__).parameters
    if device.type == "cuda" and "fused" in accepted:
        return {"fused": True}
    if "foreach" in accepted and device.type != "cpu":
        return {"foreach": True}
    return {}  # on CPU torch picks the fastest path itself


def build_optimizer(params: Iterable[torch.nn.Parameter], config: OptimConfig, batch_size: int,
                    device: torch.device) -> torch.optim.Optimizer:
    cls = _CLASSES[config.name]
    lr = effective_lr(config, batch_size)
    kwargs: dict[str, object] = {"lr": lr, "weight_decay": config.weight_decay}
    if config.name == "sgd":
        kwargs.update(momentum=config.momentum, nesterov=config.nesterov)
    elif config.name == "rmsprop":
        kwargs.update(momentum=config.momentum, eps=config.eps)
    elif config.name in ("adam", "adamw", "adamax", "nadam"):
        kwargs.update(betas=tuple(config.betas), eps=config.eps)
    elif config.name in ("adagrad", "adadelta"):
        kwargs.update(eps=config.eps)
    kwargs.update(_kernel_flags(cls, device))
    return cls(params, **kwargs)  # type: ignore[arg-type]
