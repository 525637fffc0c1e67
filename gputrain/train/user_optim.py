"""A user's own optimizer and LR scheduler (`Trainer(optimizer=..., scheduler=...)`): what each may
be, the one-line refusals of what cannot work, and what the run records of them.

- `optimizer`: a `torch.optim.Optimizer` instance (its parameter groups kept as they are), or a
  factory called with the parameters as the step trains them (optim/params.py's `TrainParams`).
  FSDP, TP, pipeline stages, fp8 conversion and a meta-device model replace the parameters, so an
  instance built over the model as the user built it would update tensors nothing trains: one rule
  (`_check_holds`, after parallelisation: every parameter the optimizer holds is one the step
  trains) refuses it, and is predicted before anything heavy where the layout says so.
- `scheduler`: an `LRScheduler` instance over the optimizer in use, or a factory `optimizer ->
  LRScheduler`. The loop steps it once per applied optimizer step, as it steps the config's schedule.
- The config's `optim.*` stays the CLI's way: a field the config sets explicitly and a user's
  optimizer or scheduler that replaces it are refused together, naming the fields (`check_given`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from gputrain.config import Config
from gputrain.config.load import read_toml
from gputrain.config.schema import OptimConfig
from gputrain.distributed.parallel_dims import ParallelDims
from gputrain.errors import UsageError, first_line
from gputrain.optim.optimizers import fused_kernel_fits
from gputrain.optim.params import TrainParams, train_params

OptimizerArg = torch.optim.Optimizer | Callable[[TrainParams], torch.optim.Optimizer]
SchedulerArg = LRScheduler | Callable[[torch.optim.Optimizer], LRScheduler]

OPTIMIZER_FIELDS = ("name", "lr", "weight_decay", "decay", "momentum", "nesterov", "betas", "eps", "scale_lr",
                    "base_batch_size")  # fmt: skip
"""The `optim.*` fields that make the config's optimizer: `optimizer=` replaces them all."""
SCHEDULE_FIELDS = ("schedule", "warmup_steps", "step_size", "gamma", "milestones", "min_lr")
"""The `optim.*` fields that make the config's LR schedule: `scheduler=` replaces them all."""

_FACTORY_EXAMPLE = "optimizer=functools.partial(torch.optim.AdamW, lr=1e-3) or optimizer=lambda params: ..."


def _what(value: Any) -> str:
    return f"a {type(value).__module__}.{type(value).__qualname__}"


# ----------------------------------------------------------------- from the arguments alone
def check_given(optimizer: Any, scheduler: Any, source: Any, config: Config) -> None:
    """What the arguments alone tell (the Trainer's constructor): each is of a kind the run can use,
    a scheduler instance is over the optimizer instance given, and the config sets none of the
    fields they replace (`source`: the config as given, which says what it sets explicitly)."""
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer) and not callable(optimizer):
        raise UsageError(
            f"optimizer= is {_what(optimizer)}: pass a torch.optim.Optimizer or a factory params -> Optimizer, "
            f"e.g. {_FACTORY_EXAMPLE}"
        )
    if isinstance(optimizer, torch.optim.Optimizer) and not any(g["params"] for g in optimizer.param_groups):
        raise UsageError("optimizer= holds no parameters: build it over the model's parameters, or pass a factory")
    if scheduler is not None:
        _check_scheduler_arg(scheduler, optimizer)
    check_no_mix(explicit_optim_fields(source, config), optimizer is not None, scheduler is not None)


def _check_scheduler_arg(scheduler: Any, optimizer: Any) -> None:
    if isinstance(scheduler, ReduceLROnPlateau):
        raise UsageError(
            "scheduler= is a ReduceLROnPlateau, which steps on a validation metric: the run steps its "
            "scheduler once per optimizer step; pass an LRScheduler of the step (e.g. OneCycleLR, LambdaLR)"
        )
    if not isinstance(scheduler, LRScheduler):
        if not callable(scheduler):
            raise UsageError(
                f"scheduler= is {_what(scheduler)}: pass a torch.optim.lr_scheduler.LRScheduler or a factory "
                "optimizer -> LRScheduler, e.g. scheduler=lambda opt: OneCycleLR(opt, max_lr=1e-2, total_steps=...)"
            )
        return
    if scheduler.optimizer is optimizer:
        return
    over = (
        "the config's optimizer, which the run builds itself"
        if optimizer is None
        else "the optimizer optimizer= makes"
        if not isinstance(optimizer, torch.optim.Optimizer)
        else "the optimizer= given"
    )
    raise UsageError(
        f"scheduler= is a {type(scheduler).__name__} over another optimizer than {over}: pass a factory, "
        f"e.g. scheduler=lambda opt: {type(scheduler).__name__}(opt, ...)"
    )


def explicit_optim_fields(source: Any, config: Config) -> set[str]:
    """The `optim.*` fields the config sets explicitly: those a dict or a TOML file names, or, for a
    `Config` (which keeps no record of what was set) and for the config.toml of a run that had a
    user's optimizer (which names every field), those that differ from the defaults."""
    if isinstance(source, Config):
        defaults = OptimConfig()
        return {f.name for f in fields(OptimConfig) if getattr(config.optim, f.name) != getattr(defaults, f.name)}
    if isinstance(source, (str, Path)):
        path, source = source, read_toml(source)
        if _written_with_a_users_optimizer(path):  # its [optim] is complete, and was not what that run used
            defaults = OptimConfig()
            return {f.name for f in fields(OptimConfig) if getattr(config.optim, f.name) != getattr(defaults, f.name)}
    if not isinstance(source, Mapping):
        return set()
    named: set[str] = set()
    for key, value in source.items():
        section, _, field = str(key).partition(".")
        if section != "optim":
            continue
        if field:
            named.add(field)
        elif isinstance(value, Mapping):
            named.update(map(str, value))
    return named


def check_no_mix(explicit: set[str], optimizer_given: bool, scheduler_given: bool) -> None:
    """Refuse a user's optimizer (scheduler) where the config sets a field of its own (schedule)."""
    mixed = sorted(f"optim.{f}" for f in explicit if optimizer_given and f in OPTIMIZER_FIELDS)
    mixed += sorted(f"optim.{f}" for f in explicit if scheduler_given and f in SCHEDULE_FIELDS)
    if mixed:
        given = " and ".join(n for n, on in (("optimizer=", optimizer_given), ("scheduler=", scheduler_given)) if on)
        named = ", ".join(mixed[:6]) + (f" and {len(mixed) - 6} more" if len(mixed) > 6 else "")
        raise UsageError(
            f"{given} and the config's {named} would both set the run's "
            f"{'optimizer' if optimizer_given else 'schedule'}: the config's optim.* is the CLI's way; "
            f"remove {'it' if len(mixed) == 1 else 'them'} from the config or leave out {given}"
        )


# ----------------------------------------------------------------- before anything heavy
def _replaced_by(dims: ParallelDims, on_meta: bool, fp8: bool) -> str | None:
    """What replaces the model's parameters in this layout, where something does."""
    if on_meta:
        return "the model is on the meta device and is materialised rank by rank"
    if dims.fsdp_enabled:
        return "FSDP shards them"
    if dims.tp_enabled:
        return "tensor parallelism splits them"
    if dims.pp_enabled:
        return "pipeline parallelism keeps only this rank's stage"
    if fp8:
        return "the fp8 conversion replaces the Linear layers"
    return None


def _refuse_instance(why: str) -> UsageError:
    return UsageError(
        f"optimizer= is an instance over parameters the training step does not update ({why}): "
        f"pass a factory, called with the parameters as the step trains them, e.g. {_FACTORY_EXAMPLE}"
    )


def check_instance_early(optimizer: Any, dims: ParallelDims, on_meta: bool) -> None:
    """An optimizer instance in a layout that replaces every parameter it could hold: refused
    before the run directory is claimed (`_check_holds` is the rule; this predicts it)."""
    # a TP plan may leave some layers whole, and fp8 may keep the Linear weights: left to the rule
    if isinstance(optimizer, torch.optim.Optimizer) and (on_meta or dims.fsdp_enabled or dims.pp_enabled):
        raise _refuse_instance(_replaced_by(dims, on_meta, fp8=False) or "")


def states_per_param(optimizer: Any) -> int | None:
    """Tensors the size of a parameter that `optimizer`'s state keeps (one step of its class with its
    first group's settings on a throwaway tensor); None where that cannot be told (a factory, which
    makes its optimizer only once the model is parallelised, or a class the probe cannot step)."""
    from gputrain.checkpoint.matching import state_layout

    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    layout = state_layout(type(optimizer), optimizer.param_groups[0])
    return None if layout is None else sum(kind == "param" for kind in layout.values())


# ----------------------------------------------------------------- after parallelisation
def make_optimizer(
    given: OptimizerArg, model: nn.Module, dims: ParallelDims, on_meta: bool, fp8: bool
) -> torch.optim.Optimizer:
    """The user's optimizer over `model` (this rank's parallelised module): the instance, checked,
    or what the factory makes of `model`'s TrainParams."""
    params = train_params(model)
    if isinstance(given, torch.optim.Optimizer):
        optimizer = given
    else:
        optimizer = _made_by("optimizer=", given, params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError(
                f"optimizer= factory {_name_of(given)} returned {_what(optimizer)}, not a torch.optim.Optimizer"
            )
    _check_holds(optimizer, params, model, isinstance(given, torch.optim.Optimizer), dims, on_meta, fp8)
    _check_fused(optimizer)
    return optimizer


def _made_by(option: str, factory: Any, argument: Any) -> Any:
    """What the user's `factory` returns for `argument`; its failure is one line naming the option."""
    try:
        return factory(argument)
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - the user's code: one line, as bad input is
        raise UsageError(
            f"{option} factory {_name_of(factory)} raised {type(err).__name__}: {first_line(err, 160)}"
        ) from None


def _name_of(factory: Any) -> str:
    target = factory.func if isinstance(factory, functools.partial) else factory
    return getattr(target, "__name__", type(target).__name__)


def _check_holds(
    optimizer: torch.optim.Optimizer,
    params: TrainParams,
    model: nn.Module,
    instance: bool,
    dims: ParallelDims,
    on_meta: bool,
    fp8: bool,
) -> None:
    """Every parameter the optimizer holds is one the step trains, held once, and it holds them all."""
    trained = {id(p) for p in model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    if not held:
        raise UsageError("optimizer= holds no parameters: build it over the parameters it is given")
    if len({id(p) for p in held}) != len(held):  # torch refuses this when built; a group added later is not
        raise UsageError("optimizer= holds a parameter in two parameter groups: give each parameter one group")
    if all(id(p) in trained for p in held):
        _check_covers(params, {id(p) for p in held})
        return
    if instance:
        raise _refuse_instance(_replaced_by(dims, on_meta, fp8) or "they are not the model's parameters")
    raise UsageError(
        f"optimizer= factory {type(optimizer).__name__} holds tensors that are not the model's parameters as "
        "the step trains them: build it over the params the factory is given"
    )


def _check_covers(params: TrainParams, held: set[int]) -> None:
    """Every parameter the step trains is in the optimizer: one left out would still get a gradient
    each step that nothing zeroes, piling up in the gradient norm the run logs, clips and guards."""
    left_out = [name for name, p in params.named() if id(p) not in held]
    if left_out:
        named = ", ".join(left_out[:3]) + (f" and {len(left_out) - 3} more" if len(left_out) > 3 else "")
        raise UsageError(
            f"optimizer= leaves out {len(left_out)} trained parameter{'s' * (len(left_out) != 1)} ({named}): "
            "their gradients would pile up unzeroed; give the optimizer every parameter, or set "
            "requires_grad=False on those it should not train"
        )


def _check_fused(optimizer: torch.optim.Optimizer) -> None:
    """fused=True where torch's fused kernel cannot step these parameters (fused SGD or Adagrad over
    sharded DTensors, which torch would refuse at the first step)."""
    if not optimizer.defaults.get("fused"):
        return
    base = next((cls for cls in type(optimizer).__mro__ if cls in _FUSED_BASES), None)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if base is not None and not fused_kernel_fits(base, params):
        raise UsageError(
            f"optimizer= is a {type(optimizer).__name__} with fused=True, whose fused kernel cannot step these "
            "(sharded) parameters: leave fused unset (torch then uses foreach)"
        )


_FUSED_BASES = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad)


def make_scheduler(given: SchedulerArg, optimizer: torch.optim.Optimizer) -> LRScheduler:
    """The user's scheduler over `optimizer`: the instance, or what the factory makes of it."""
    if isinstance(given, LRScheduler):
        scheduler = given
    else:
        scheduler = _made_by("scheduler=", given, optimizer)
        if isinstance(scheduler, ReduceLROnPlateau) or not isinstance(scheduler, LRScheduler):
            raise UsageError(
                f"scheduler= factory {_name_of(given)} returned {_what(scheduler)}, not an LRScheduler stepped per "
                "optimizer step"
            )
    _check_scheduler_arg(scheduler, optimizer)
    return scheduler


# ----------------------------------------------------------------- what the run records
def kernel_path(optimizer: torch.optim.Optimizer) -> str:
    """How the optimizer's step runs: "fused" (one kernel), "foreach" (a kernel per op over all the
    tensors), "for-loop" (torch's per-parameter loop) or "its own step" (a class without torch's
    kernel options). torch picks foreach itself where foreach is left unset and every parameter is
    on a CUDA device."""
    defaults = optimizer.defaults
    if defaults.get("fused"):
        return "fused"
    if "foreach" not in defaults:
        return "its own step"
    if defaults["foreach"] is None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        on_gpu = bool(params) and all(p.device.type == "cuda" for p in params)
        return "foreach" if on_gpu and not defaults.get("differentiable") else "for-loop"
    return "foreach" if defaults["foreach"] else "for-loop"


def _plain(value: Any) -> Any:
    """A hyperparameter as JSON holds it: numbers, strings, lists; a one-value tensor as a number."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else f"tensor of shape {list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return type(value).__name__


def describe(
    optimizer: torch.optim.Optimizer, scheduler: LRScheduler, guard_mode: str, guard_on_device: bool, own: str
) -> dict[str, Any]:
    """summary.json's "optimizer" block for a run with a user's optimizer or scheduler (`own`: which
    of them): the class, each parameter group's settings (its parameters counted, not listed), the
    kernel path and where the non-finite guard decides."""
    cls = type(optimizer)
    return {
        "given": own,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "param_groups": [
            {"params": len(group["params"]), **{k: _plain(v) for k, v in group.items() if k != "params"}}
            for group in optimizer.param_groups
        ],
        "kernel": kernel_path(optimizer),
        "scheduler": type(scheduler).__name__,
        "nonfinite_guard": "off" if guard_mode == "off" else ("device" if guard_on_device else "host"),
    }


def describe_line(record: dict[str, Any]) -> str:
    """The console's line for it."""
    groups = record["param_groups"]
    return (
        f"optimizer: {record['class'].rsplit('.', 1)[-1]} ({record['given']}; {len(groups)} parameter group"
        f"{'s' * (len(groups) != 1)}), {record['kernel']} step, LR schedule {record['scheduler']}, "
        f"non-finite guard {record['nonfinite_guard']}"
    )


_NOTE_START = "[optim] below is not what this run used for "


def _written_with_a_users_optimizer(path: str | Path) -> bool:
    """Whether `path` is the config.toml of a run with a user's optimizer or scheduler (`config_note`)."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.readline().removeprefix("\ufeff").startswith(f"# {_NOTE_START}")
    except (OSError, UnicodeDecodeError):
        return False


def config_note(record: dict[str, Any]) -> str:
    """config.toml's head for such a run: which of its optim.* fields the run did not use."""
    given = record["given"]
    replaced = []
    if "optimizer=" in given:
        groups = len(record["param_groups"])
        kind = f"{record['class']}, {groups} parameter group{'s' * (groups != 1)}"
        replaced.append(f"the optimizer ({kind}: the Trainer's optimizer=)")
    if "scheduler=" in given:
        replaced.append(f"the LR schedule ({record['scheduler']}: the Trainer's scheduler=)")
    return f'{_NOTE_START}{" and ".join(replaced)};\nsummary.json\'s "optimizer" block records their settings.'
