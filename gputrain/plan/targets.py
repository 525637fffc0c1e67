"""Build what the planner measures (`PlanTarget`) from a config, a model and its data, and resolve
`train.batch_size=auto` / `train.micro_batch_size=auto` before a run is laid out."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gputrain.models.outputs import model_logits
from gputrain.plan.planner import PlanTarget

if TYPE_CHECKING:
    from gputrain.config.schema import Config

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


def surrogate_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """A loss with cross-entropy's memory (log-softmax saves one output-sized tensor) for a step whose
    targets are not known: what auto measures from an input sample alone."""
    out = model_logits(model(batch[0]))
    return torch.log_softmax(out.float(), dim=-1).mean()


def optimizer_factory(config: Config, device: torch.device) -> Any:
    from gputrain.optim import build_optimizer

    global_batch = config.train.batch_size if isinstance(config.train.batch_size, int) else 1
    return lambda params: build_optimizer(params, config.optim, global_batch, device)


def autocast_for(precision: str, device: torch.device) -> Any:
    dtype = _AUTOCAST.get(precision)
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device.type, dtype=dtype)


def build_target(
    config: Config,
    model: nn.Module,
    sample: Any,
    device: torch.device,
    precision: str,
    loss_of: Any = surrogate_loss,
) -> PlanTarget:
    """What one step of this run does, for the planner. `sample` is (inputs, targets) or (inputs,)."""
    from gputrain.optim.states import optimizer_states_per_param

    accum = config.train.grad_accum if isinstance(config.train.grad_accum, int) else 1
    return PlanTarget(
        model=model,
        sample=sample,
        loss_of=loss_of,
        make_optimizer=optimizer_factory(config, device),
        device=device,
        autocast=autocast_for(precision, device),
        param_bytes_factor=0.5 if precision in _AUTOCAST else 1.0,
        accum=accum,
        pp_schedule=config.parallel.pp_schedule,
        optimizer_states=optimizer_states_per_param(config.optim.name, config.optim.momentum),
    )


def data_parallel_ranks(config: Config, world: int) -> int:
    par = config.parallel
    other = max(1, par.tp) * max(1, par.pp) if par.strategy in ("tp", "pp", "hybrid") else 1
    return max(1, world // other)
