"""Whether an intact checkpoint is this run's: its weights and optimizer state, checked against this
run's model and optimizer before anything is loaded into them.

A checkpoint whose bytes verify can still belong to another run: the model's shape changed, a
parameter was renamed, the optimizer is another kind, or a file was edited and resealed. Loading it
anyway fails half-way (`size mismatch for 1.weight`, `KeyError: 'momentum'`) with some state already
applied, or later, at the first step. The checks here compare names, shapes, dtypes and the optimizer's
structure first and raise `CheckpointMismatch` (exit 2), one line naming what differs; nothing has
been changed when it is raised.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gputrain.errors import UsageError


class CheckpointMismatch(UsageError):
    """An intact checkpoint that is not this run's (other model, optimizer or state); exit code 2.
    The message is `cannot resume: PATH: what differs`."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"cannot resume: {path}: {problem}")


# ----------------------------------------------------------------------------- wording
def listing(names: Iterable[str], limit: int = 3) -> str:
    """`a, b, c (+4 more)`."""
    items = list(names)
    shown = ", ".join(items[:limit])
    return shown + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def shape_text(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def dtype_text(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def kind_of_value(value: Any) -> str:
    """A value's kind in words, for messages: `a str`, `a list`, `a tensor`."""
    if isinstance(value, torch.Tensor):
        return "a tensor"
    if value is None:
        return "None"
    name = type(value).__name__
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def is_number(value: Any) -> bool:
    """An int or float (not a bool), or a one-element tensor holding one."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex


def same_kind(live: Any, saved: Any) -> bool:
    """Whether a saved plain value can stand where this run has `live`: numbers for numbers, a bool
    for a bool, sequences of the same length element by element, dicts with the same keys. None on
    either side is a placeholder (an unset option) and fits anything."""
    if live is None or saved is None:
        return True
    if isinstance(live, bool) or isinstance(saved, bool):
        return isinstance(live, bool) and isinstance(saved, bool)
    if is_number(live):
        return is_number(saved)
    if isinstance(live, torch.Tensor):
        return isinstance(saved, torch.Tensor) and tuple(live.shape) == tuple(saved.shape)
    if isinstance(live, str):
        return isinstance(saved, str)
    if isinstance(live, (list, tuple)):
        return (
            isinstance(saved, (list, tuple))
            and len(live) == len(saved)
            and all(same_kind(a, b) for a, b in zip(live, saved))
        )
    if isinstance(live, Mapping):
        return (
            isinstance(saved, Mapping) and set(live) == set(saved) and all(same_kind(live[k], saved[k]) for k in live)
        )
    return type(live) is type(saved)


def first_difference(live: Any, saved: Any, where: str) -> str | None:
    """Where a saved structure stops fitting this run's (`scheduler.base_lrs: a list of 2, this
    run's has 1`), or None."""
    if same_kind(live, saved):
        return None
    if isinstance(live, Mapping) and isinstance(saved, Mapping):
        missing = [str(k) for k in live if k not in saved]
        extra = [str(k) for k in saved if k not in live]
        if missing:
            return f"{where} lacks {listing(missing)}"
        if extra:
            return f"{where} has {listing(extra)}, which this run's does not"
        for key in live:
            found = first_difference(live[key], saved[key], f"{where}.{key}")
            if found:
                return found
    if isinstance(live, (list, tuple)) and isinstance(saved, (list, tuple)):
        if len(live) != len(saved):
            return f"{where} has {len(saved)} entries, this run's has {len(live)}"
        for i, (a, b) in enumerate(zip(live, saved)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
    return f"{where} is {kind_of_value(saved)}, this run's is {kind_of_value(live)}"


# ----------------------------------------------------------------------------- weights
@dataclass(frozen=True, slots=True)
class Spec:
    """A tensor as a checkpoint describes it."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None  # None: not stated (then not compared)

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Spec:
        return cls(tuple(int(n) for n in tensor.shape), tensor.dtype)  # a DTensor's shape is the global one


# wrapper modules that put a segment into parameter names without changing the model (DDP, torch.compile,
# activation checkpointing, FSDP1); torch.distributed.checkpoint's state dicts leave them out
_WRAPPER_SEGMENTS = ("module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")


def canonical_name(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


def tied_groups(model: nn.Module, canonical: bool = False) -> list[set[str]]:
    """Names that are one tensor (tied weights): a checkpoint needs only one of each group."""
    by_tensor: dict[int, set[str]] = {}
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        by_tensor.setdefault(id(tensor), set()).add(canonical_name(name) if canonical else name)
    return [names for names in by_tensor.values() if len(names) > 1]


def check_weights(
    path: Path,
    label: str,
    saved: Mapping[str, Spec],
    expected: Mapping[str, Spec],
    ties: list[set[str]],
    known: set[str] | None = None,
) -> None:
    """Raise CheckpointMismatch unless the checkpoint's tensors are this run's model's: the same
    names (one name of a tied group is enough), shapes and dtypes.

    Args:
        label: the file the tensors come from (named in the message).
        saved: the checkpoint's tensors.
        expected: this process's model (a pipeline stage holds a part of the model).
        known: every name any process of this job holds (default: `expected`).
    """
    tie_of = {name: group for group in ties for name in group}
    missing = [n for n in expected if n not in saved and not (tie_of.get(n, set()) & set(saved))]
    known = set(expected) if known is None else known
    unexpected = [n for n in saved if n not in known]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"this run's model has {listing(missing)}, which the checkpoint lacks")
        if unexpected:
            parts.append(f"the checkpoint has {listing(unexpected)}, which this run's model lacks")
        raise CheckpointMismatch(path, f"{label}: the parameters differ: " + "; ".join(parts))
    shapes = [n for n in expected if n in saved and saved[n].shape != expected[n].shape]
    if shapes:
        name = shapes[0]
        more = f" ({len(shapes) - 1} more differ: {listing(shapes[1:])})" if len(shapes) > 1 else ""
        raise CheckpointMismatch(
            path,
            f"{label}: {name} has shape {shape_text(saved[name].shape)} in the checkpoint, "
            f"{shape_text(expected[name].shape)} in this run's model{more}",
        )
    dtypes = [
        (n, were, are)
        for n in expected
        if n in saved
        for were, are in [(saved[n].dtype, expected[n].dtype)]
        if were is not None and are is not None and were != are
    ]
    if dtypes:
        name, were, are = dtypes[0]
        more = f" ({len(dtypes) - 1} more differ)" if len(dtypes) > 1 else ""
        raise CheckpointMismatch(
            path,
            f"{label}: {name} is {dtype_text(were)} in the checkpoint, {dtype_text(are)} in this run's model{more}",
        )


# ----------------------------------------------------------------------------- optimizers
# Keys the LR schedulers add to an optimizer's parameter groups (not the optimizer's own settings).
_SCHEDULER_KEYS = {"initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum"}
# Settings about where and how the kernels run; a probe on the CPU leaves them at their defaults.
_KERNEL_FLAGS = {"foreach": None, "fused": None, "capturable": False, "differentiable": False}
_KNOWN_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.AdamW,
    torch.optim.Adam,
    torch.optim.SGD,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.ASGD,
)


_SETTINGS: dict[type, frozenset[str]] = {}


def _default_settings(cls: type[torch.optim.Optimizer]) -> frozenset[str]:
    """The settings an optimizer's parameter groups carry (empty for one that needs arguments)."""
    if cls not in _SETTINGS:
        try:
            optimizer: Any = cls
            _SETTINGS[cls] = frozenset(optimizer([torch.zeros(1, requires_grad=True)]).param_groups[0]) - {"params"}
        except Exception:  # noqa: BLE001 - an optimizer that needs arguments: not a candidate
            _SETTINGS[cls] = frozenset()
    return _SETTINGS[cls]


def optimizer_kind(settings: Iterable[str], preferred: type[torch.optim.Optimizer]) -> str | None:
    """The optimizer whose parameter groups have these settings (`preferred` where it fits)."""
    keys = set(settings) - _SCHEDULER_KEYS
    if _default_settings(preferred) and _default_settings(preferred) == keys:
        return preferred.__name__
    for cls in _KNOWN_OPTIMIZERS:
        if _default_settings(cls) == keys:
            return cls.__name__
    return None


# What one parameter's optimizer state holds: per key, "param" (a tensor of the parameter's shape),
# "scalar" (a one-element tensor), "tensor" (another shape) or "value" (a plain value).
StateLayout = dict[str, str]
_PROBE_SHAPE = (2, 3)


def _probe_kwargs(cls: type[torch.optim.Optimizer], settings: Mapping[str, Any]) -> dict[str, Any]:
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {k: v for k, v in settings.items() if k in accepted and k != "params"}
    kwargs.update({k: v for k, v in _KERNEL_FLAGS.items() if k in accepted})
    return kwargs


def state_layout(cls: type[torch.optim.Optimizer], settings: Mapping[str, Any]) -> StateLayout | None:
    """The state one step of `cls` with these settings leaves for a parameter (found by stepping a
    throwaway optimizer on a tiny tensor: exact for any torch version), or None when it cannot tell."""
    kwargs = _probe_kwargs(cls, settings)
    key = (cls, repr(sorted(kwargs.items())))
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    layout: StateLayout | None
    try:
        param = torch.zeros(_PROBE_SHAPE, requires_grad=True)
        probe = cls([param], **kwargs)
        param.grad = torch.ones_like(param)
        probe.step()
        layout = {}
        for name, value in probe.state[param].items():
            if isinstance(value, torch.Tensor):
                layout[name] = (
                    "param" if tuple(value.shape) == _PROBE_SHAPE else "scalar" if value.numel() == 1 else "tensor"
                )
            else:
                layout[name] = "value"
    except Exception:  # noqa: BLE001 - settings this optimizer refuses: the state cannot be predicted
        layout = None
    if len(_LAYOUTS) < 256:
        _LAYOUTS[key] = layout
    return layout


_LAYOUTS: dict[tuple[type, str], StateLayout | None] = {}


@dataclass(frozen=True, slots=True)
class SavedItem:
    """One entry of a parameter's saved optimizer state: a tensor (with its shape) or a plain value."""

    shape: tuple[int, ...] | None  # None: a plain value
    value: Any = None

    @classmethod
    def of(cls, value: Any) -> SavedItem:
        if isinstance(value, torch.Tensor):
            return cls(tuple(int(n) for n in value.shape))
        return cls(None, value)


@dataclass(slots=True)
class SavedOptimizer:
    """An optimizer's saved state, whatever the format: parameter groups (settings and the keys of
    their parameters) and each parameter's state."""

    groups: list[dict[str, Any]]
    params: list[list[Any]]
    state: dict[Any, dict[str, SavedItem]]
    kind: str | None
    membership: bool = True
    """Whether `params` says which group holds which parameter (else it is not checked)."""


@dataclass(frozen=True, slots=True)
class LiveParam:
    """A parameter of this run's optimizer: its name, global shape, group and key in the checkpoint."""

    name: str
    shape: tuple[int, ...]
    group: int
    key: Any
    trainable: bool


def positional_optimizer(path: Path, osd: Any, kind: Any) -> SavedOptimizer:
    """Read `optimizer.state_dict()` as saved in state.pt; raise CheckpointMismatch where it is not one."""
    if not isinstance(osd, Mapping):
        raise CheckpointMismatch(path, f"state.pt: the optimizer state is {kind_of_value(osd)}, not an optimizer's")
    if not isinstance(osd.get("state"), Mapping):
        raise CheckpointMismatch(
            path, f"state.pt: the optimizer's state entry is {kind_of_value(osd.get('state'))}, not a dict"
        )
    groups = osd.get("param_groups")
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, Mapping) for g in groups):
        raise CheckpointMismatch(path, "state.pt: the optimizer's param_groups are not a list of parameter groups")
    params = []
    for i, group in enumerate(groups):
        ids = group.get("params")
        if not isinstance(ids, (list, tuple)) or not all(isinstance(p, int) and not isinstance(p, bool) for p in ids):
            raise CheckpointMismatch(path, f"state.pt: optimizer parameter group {i} does not list its parameters")
        params.append(list(ids))
    state: dict[Any, dict[str, SavedItem]] = {}
    for key, entry in osd["state"].items():
        if not isinstance(entry, Mapping) or not all(isinstance(k, str) for k in entry):
            raise CheckpointMismatch(path, f"state.pt: the optimizer state of parameter {key!r} is not a dict")
        state[key] = {k: SavedItem.of(v) for k, v in entry.items()}
    return SavedOptimizer(
        [{k: v for k, v in g.items() if k != "params"} for g in groups],
        params,
        state,
        kind if isinstance(kind, str) else None,
    )


def check_optimizer(
    path: Path,
    optimizer: torch.optim.Optimizer,
    saved: SavedOptimizer,
    live: list[LiveParam],
    *,
    positional: bool,
    live_layout_needed: bool = False,
) -> None:
    """Raise CheckpointMismatch unless `saved` fits this run's optimizer: the same kind, as many
    parameter groups with every setting this run's uses (of the same type), each parameter of this
    run's found in the same group, and each parameter's state holding exactly the keys this kind
    keeps, tensors of the parameter's shape where it keeps such.

    Args:
        live: this run's parameters, each with the key its state has in the checkpoint.
        positional: the checkpoint keys parameters by position (then group sizes must match).
        live_layout_needed: the loader asks for the state keys this run's settings produce
            (torch.distributed.checkpoint loads into the state an initialised optimizer holds).
    """
    cls = type(optimizer)
    live_groups = optimizer.param_groups
    saved_keys = set().union(*(set(g) for g in saved.groups)) if saved.groups else set()
    kind = saved.kind or optimizer_kind(saved_keys, cls)  # by its settings where state.pt does not say
    if kind is not None and kind != cls.__name__:
        raise CheckpointMismatch(
            path, f"the optimizer differs: the checkpoint's is {kind}, this run's is {cls.__name__}"
        )
    if len(saved.groups) != len(live_groups):
        raise CheckpointMismatch(
            path,
            f"the optimizer has {len(saved.groups)} parameter group(s) in the checkpoint, "
            f"{len(live_groups)} in this run's",
        )
    for i, (group, live_group) in enumerate(zip(saved.groups, live_groups)):
        lacking = [k for k in live_group if k != "params" and k not in group]
        if lacking:
            what = "schedule" if set(lacking) <= _SCHEDULER_KEYS else cls.__name__
            raise CheckpointMismatch(
                path,
                f"the optimizer's parameter group {i} lacks {listing(lacking)}, which this run's {what} uses "
                f"(the checkpoint's optimizer is {kind or 'another kind'})",
            )
        for key, value in live_group.items():
            found = None if key == "params" else first_difference(value, group[key], f"the optimizer setting {key}")
            if found:
                raise CheckpointMismatch(path, f"{found} (parameter group {i})")
        if positional and len(saved.params[i]) != len(live_group["params"]):
            raise CheckpointMismatch(
                path,
                f"the optimizer's parameter group {i} holds {len(saved.params[i])} parameters in the checkpoint, "
                f"{len(live_group['params'])} in this run's",
            )
    group_of: dict[Any, int] = {}
    for i, keys in enumerate(saved.params):
        for key in keys:
            if key in group_of:
                raise CheckpointMismatch(path, f"the optimizer lists parameter {key} in two parameter groups")
            group_of[key] = i
    strays = [str(k) for k in saved.state if k not in group_of]
    if strays and saved.membership:
        raise CheckpointMismatch(path, f"the optimizer holds state for {listing(strays)}, which no parameter group has")
    layouts = [state_layout(cls, group) for group in saved.groups]
    live_layouts = [state_layout(cls, g) for g in live_groups] if live_layout_needed else []
    for param in live:
        if not saved.membership:
            group_of.setdefault(param.key, param.group)
        if param.key not in group_of:
            raise CheckpointMismatch(path, f"the optimizer state lacks {param.name}")
        if group_of[param.key] != param.group:
            raise CheckpointMismatch(
                path,
                f"the optimizer has {param.name} in parameter group {group_of[param.key]}, "
                f"this run's in group {param.group}",
            )
        entry = saved.state.get(param.key)
        layout = layouts[param.group]
        if layout is None:
            continue
        needed = set(layout)
        if live_layout_needed and param.trainable and live_layouts[param.group] is not None:
            needed |= set(live_layouts[param.group] or {})
        if entry is None:
            if live_layout_needed and param.trainable and needed:
                raise CheckpointMismatch(
                    path, f"the optimizer state of {param.name} lacks {listing(sorted(needed))} ({cls.__name__})"
                )
            continue  # no state yet: the optimizer starts it at the next step
        if set(entry) != needed:
            lacking = sorted(needed - set(entry))
            extra = sorted(set(entry) - needed)
            detail = "; ".join(
                part
                for part in (
                    f"lacks {listing(lacking)}" if lacking else "",
                    f"has {listing(extra)}, which {cls.__name__} does not keep" if extra else "",
                )
                if part
            )
            raise CheckpointMismatch(path, f"the optimizer state of {param.name} {detail}")
        for key, item in entry.items():
            want = layout.get(key, "tensor")
            if want == "value" or (item.shape is None and want == "scalar" and is_number(item.value)):
                continue
            if item.shape is None:
                raise CheckpointMismatch(
                    path,
                    f"the optimizer state {key} of {param.name} is {kind_of_value(item.value)}, not a tensor",
                )
            if want == "param" and item.shape != param.shape:
                raise CheckpointMismatch(
                    path,
                    f"the optimizer state {key} of {param.name} has shape {shape_text(item.shape)}, "
                    f"the parameter {shape_text(param.shape)}",
                )
            if want == "scalar" and item.shape not in ((), (1,)):
                raise CheckpointMismatch(
                    path, f"the optimizer state {key} of {param.name} has shape {shape_text(item.shape)}, not one value"
                )


def live_params(
    optimizer: torch.optim.Optimizer,
    name_of: Callable[[torch.Tensor], str],
    key_of: Callable[[int, int, str], Any],
) -> list[LiveParam]:
    """This run's optimizer parameters in order; key_of(group, index in the group, name) gives each
    one's key in the checkpoint."""
    found = []
    for g, group in enumerate(optimizer.param_groups):
        for j, param in enumerate(group["params"]):
            name = name_of(param)
            found.append(
                LiveParam(name, tuple(int(n) for n in param.shape), g, key_of(g, j, name), param.requires_grad)
            )
    return found


def names_by_tensor(model: nn.Module, canonical: bool = False) -> Callable[[torch.Tensor], str]:
    names: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), canonical_name(name) if canonical else name)
    return lambda t: names.get(id(t), "a parameter outside the model")
