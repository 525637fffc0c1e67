"""Optimizers by name, using torch's fused or foreach kernels where the device has them."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from gputrain.config.schema import OptimConfig
from gputrain.distributed.dtensor import is_dtensor
from gputrain.optim.params import weight_decay_groups

_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
    "adadelta": torch.optim.Adadelta,
    "adamax": torch.optim.Adamax,
    "nadam": torch.optim.NAdam,
}


def effective_lr(config: OptimConfig, batch_size: int) -> float:
    """The peak LR, with the linear scaling rule applied when asked for."""
    if config.scale_lr == "linear":
        return config.lr * batch_size / config.base_batch_size
    return config.lr


# The kernel each fused optimizer runs; DTensor must know how to shard it for FSDP2/TP parameters.
_FUSED_OPS: dict[type[torch.optim.Optimizer], str] = {
    torch.optim.SGD: "_fused_sgd_",
    torch.optim.Adam: "_fused_adam_",
    torch.optim.AdamW: "_fused_adamw_",
    torch.optim.Adagrad: "_fused_adagrad_",
}
# Sharding rules every supported torch (2.10+) registers, should the registry below not be readable.
_SHARDED_FUSED_KNOWN = {"_fused_adam_", "_fused_adamw_"}


def _dtensor_has_rule(op_name: str) -> bool:
    """Whether DTensor can run aten.<op_name> on sharded tensors (any torch version)."""
    if op_name in _SHARDED_FUSED_KNOWN:
        return True
    packet = getattr(torch.ops.aten, op_name, None)
    from torch.distributed.tensor import DTensor  # only asked about sharded parameters: already imported

    try:
        propagator = DTensor._op_dispatcher.sharding_propagator
        tables = [
            getattr(propagator, name, {})
            for name in ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules")
        ]
    except AttributeError:  # a torch whose internals moved: trust only the known rules
        return False
    return packet is not None and all(
        any(getattr(packet, overload) in table for table in tables) for overload in packet.overloads()
    )


def fused_kernel_fits(cls: type[torch.optim.Optimizer], params: Sequence[torch.Tensor]) -> bool:
    """Whether `cls(params, fused=True)` can step: the optimizer has a fused kernel, and sharded
    (DTensor) parameters have a sharding rule for it (torch has one for Adam and AdamW only, so
    fused SGD or Adagrad would raise NotImplementedError at the first step under FSDP2 or TP)."""
    op_name = _FUSED_OPS.get(cls)
    if op_name is None or "fused" not in inspect.signature(cls.__init__).parameters:
        return False
    return not any(is_dtensor(p) for p in params) or _dtensor_has_rule(op_name)


def _fake(params: Sequence[torch.Tensor]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(p, FakeTensor) for p in params)


_FUSED_FAKE: dict[tuple[type[torch.optim.Optimizer], str], bool] = {}


def fused_step_is_fake(cls: type[torch.optim.Optimizer], device_type: str) -> bool:
    """Whether `cls(..., fused=True)` can step on fake tensors (the memory plan's) without running
    its real kernel: torch has fake implementations of the fused Adam and AdamW kernels, not of SGD's
    or Adagrad's, whose real kernel fake tensors would run on zero-filled real copies of every
    parameter, gradient and state (what the plan promises never to allocate). Tried once, on a
    1-element parameter in a fake mode of its own that runs no real kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    known = _FUSED_FAKE.get((cls, device_type))
    if known is not None:
        return known
    try:
        with FakeTensorMode(allow_fallback_kernels=False):
            param = torch.nn.Parameter(torch.empty(1, device=device_type))
            param.grad = torch.empty(1, device=device_type)
            cls([param], lr=0.1, fused=True).step()  # type: ignore[call-arg]
        runs = True
    except Exception:  # noqa: BLE001 - UnsupportedOperatorException, or a device this torch has no fakes of
        runs = False
    _FUSED_FAKE[cls, device_type] = runs
    return runs


def kernel_flags(
    cls: type[torch.optim.Optimizer], params: Sequence[torch.Tensor], device: torch.device
) -> dict[str, bool]:
    """fused where the kernel fits the parameters, else foreach on a GPU. Fused is one kernel for all
    the parameters, vectorised on a CPU too, and it can skip an update on the device (`found_inf`),
    which lets the non-finite guard work without a host sync (train/device_guard.py).

    On fake parameters (the memory plan's) a fused kernel without a fake implementation is replaced
    by the single-tensor loop: like the fused kernel it makes no temporaries the size of all the
    parameters (foreach does), at most one parameter's."""
    if device.type in ("cuda", "cpu") and fused_kernel_fits(cls, params):
        if not _fake(params) or fused_step_is_fake(cls, device.type):
            return {"fused": True}
        return {"foreach": False}
    if "foreach" in inspect.signature(cls.__init__).parameters and device.type != "cpu":
        return {"foreach": True}
    return {}  # on CPU torch picks the fastest path itself


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimConfig, batch_size: int, device: torch.device
) -> torch.optim.Optimizer:
    params = list(params)
    cls = _CLASSES[config.name]
    lr = effective_lr(config, batch_size)
    kwargs: dict[str, Any] = {"lr": lr}  # each optimizer's own settings
    if config.name == "sgd":
        kwargs.update(momentum=config.momentum, nesterov=config.nesterov)
    elif config.name == "rmsprop":
        kwargs.update(momentum=config.momentum, eps=config.eps)
    elif config.name in ("adam", "adamw", "adamax", "nadam"):
        kwargs.update(betas=tuple(config.betas), eps=config.eps)
    elif config.name in ("adagrad", "adadelta"):
        kwargs.update(eps=config.eps)
    kwargs.update(kernel_flags(cls, params, device))
    return cls(decay_groups(params, config), **kwargs)


def decay_groups(params: list[torch.nn.Parameter], config: OptimConfig) -> list[dict[str, Any]]:
    """The parameter groups and their weight decay. With optim.decay=matrices only weights of 2 or
    more dimensions decay: pulling a bias or a LayerNorm scale towards 0 regularises nothing and
    can hurt. Two groups always (one may be empty), so a checkpoint's layout does not depend on
    the model."""
    if config.decay == "all":
        return [{"params": params, "weight_decay": config.weight_decay}]
    return weight_decay_groups(params, config.weight_decay)
