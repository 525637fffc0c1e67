"""Build a model on the meta device, parallelise it there, then materialise only this rank's part of
it with the values an eager build would have given: the same seed gives the same initial weights
sharded or not, so N ranks keep training exactly like one process.

An eager build draws the initial values from the global CPU generator in a fixed order: each
layer's `reset_parameters` as it is constructed, then the model's own init (GPT-2's, torchvision's
ResNet init), then `model.init`. These are written down as *init steps*: (module name, a function
filling some of that module's own parameters and buffers). The eager build runs them on the model
itself. A deferred build records the generator's state where the build began; materialising sets
it back, replays the steps in order, each on a full-size CPU twin of one module (so every draw
consumes the generator as the eager build did), and copies this rank's slice of each tensor the
step wrote into the parallelised model. Each rank draws every value (the CPU time of one eager
init) but never holds more than its own shards plus one module's full tensors (for a GPT, the
token embedding).

A model of the user's given on meta (or a zero-argument function that builds one) is materialised
the same way: each module's `reset_parameters` in module order, then the root's `init_steps()`
where it has one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

import torch
from torch import nn

from gputrain.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterator

InitFn = Callable[[nn.Module], None]
InitStep = tuple[str, InitFn]
"""(qualified module name, fills some of that module's own parameters/buffers in place)."""

_RECORDED: WeakKeyDictionary[nn.Module, tuple[torch.Tensor, list[InitStep]]] = WeakKeyDictionary()


def is_meta(model: nn.Module) -> bool:
    """Whether `model` was built on the meta device (it holds tensors, and all of them are there).

    Raises:
        UsageError: some of its tensors are on the meta device and some are not: materialising would
            overwrite the real ones.
    """
    on_meta = {t.is_meta for t in _tensors(model)}
    if on_meta == {True, False}:
        raise UsageError(
            f"{type(model).__name__} is partly on the meta device: build it wholly there "
            "(its values are then drawn as an eager build would) or wholly on the CPU"
        )
    return on_meta == {True}


def _tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


@torch.no_grad()
def run_init_steps(model: nn.Module, steps: Iterable[InitStep]) -> None:
    """Apply init steps to `model` itself (the eager build)."""
    for name, fn in steps:
        fn(model.get_submodule(name))


def record_deferred(model: nn.Module, rng_state: torch.Tensor, extra_steps: list[InitStep]) -> None:
    """Say how a model built on meta by the registry is to be initialised: the CPU generator's state
    where its build began, and the steps after the layers' own and the model's (`model.init`)."""
    _RECORDED[model] = (rng_state, extra_steps)


def _reset(module: nn.Module) -> None:
    module.reset_parameters()  # type: ignore[operator]  # listed only where callable (construction_steps)


def construction_steps(model: nn.Module) -> list[InitStep]:
    """Each module's `reset_parameters`, in module order: what constructing the layers drew.

    Raises:
        UsageError: a module holds parameters or buffers but has no `reset_parameters` to fill them.
    """
    steps: list[InitStep] = []
    for name, module in model.named_modules():
        if not any(t is not None for t in (*module._parameters.values(), *module._buffers.values())):
            continue
        if not callable(getattr(module, "reset_parameters", None)):
            raise UsageError(
                f"cannot materialise the model built on the meta device: {name or 'the root'} "
                f"({type(module).__name__}) holds tensors but has no reset_parameters() to initialise them; "
                "give it one, or build the model on the CPU"
            )
        steps.append((name, _reset))
    return steps


def _own_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t for name, t in [*module._parameters.items(), *module._buffers.items()] if t is not None}


def shared_parameters(root: nn.Module) -> list[tuple[list[tuple[nn.Module, str]], nn.Parameter]]:
    """([(module, name), ...], the parameter) of each parameter reachable by several names (a GPT's
    embedding and head); the first name is the owner, first in module order, as FSDP's is."""
    found: dict[int, tuple[list[tuple[nn.Module, str]], nn.Parameter]] = {}
    for _, module in root.named_modules(remove_duplicate=False):
        for name, param in module._parameters.items():
            if param is not None:
                names = found.setdefault(id(param), ([], param))[0]
                if (module, name) not in names:
                    names.append((module, name))
    return [entry for entry in found.values() if len(entry[0]) > 1]


def _aliases(model: nn.Module) -> dict[int, list[tuple[str, str]]]:
    """Every (module name, tensor name) each tensor of `model` is reachable by, by the tensor's id."""
    names: dict[int, list[tuple[str, str]]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for pname, t in _own_tensors(module).items():
            names.setdefault(id(t), []).append((module_name, pname))
    return names


def _target_tensor(targets: Mapping[str, nn.Module], module_name: str, name: str) -> torch.Tensor | None:
    """The tensor this rank allocated for `module_name`.`name`; None where it holds none (a module of
    another stage, or a name outside this rank's stages that still points at the meta tensor)."""
    module = targets.get(module_name)
    tensor = None if module is None else _own_tensors(module).get(name)
    return None if tensor is None or tensor.is_meta else tensor


def _cpu_twin(module: nn.Module) -> nn.Module:
    """A shallow copy of `module` whose own tensors are full-size, uninitialised CPU tensors (its
    children stay as they are: the steps fill a module's own tensors only)."""
    twin = copy.copy(module)
    twin._parameters = {
        name: None if p is None else nn.Parameter(torch.empty_like(p, device="cpu"), requires_grad=p.requires_grad)
        for name, p in module._parameters.items()
    }
    twin._buffers = {
        name: None if b is None else torch.empty_like(b, device="cpu") for name, b in module._buffers.items()
    }
    return twin


def _write(dst: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of `full` into `dst` (a plain tensor, or a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(dst, DTensor):
        # src_data_rank=None: each rank slices its own part of its own copy, no communication
        full = distribute_tensor(full, dst.device_mesh, dst.placements, src_data_rank=None).to_local()
        dst = dst.to_local()
    dst.copy_(full)


@dataclass(slots=True)
class MetaInit:
    """How to materialise a model built on the meta device; see the module's docstring."""

    template: nn.Module
    """The model as built, on meta, before any parallelism (a copy: no memory)."""
    rng_state: torch.Tensor
    """The CPU generator's state where the eager build would have begun drawing."""
    construction: list[InitStep]
    later: list[InitStep]
    """The model's own init and `model.init`, after the layers' construction."""

    @torch.no_grad()
    def materialize(self, roots: list[nn.Module], targets: Mapping[str, nn.Module], device: torch.device) -> None:
        """Allocate the tensors of `roots` on `device` (this rank's shards only) and fill them.

        Args:
            roots: the outermost (parallelised) modules holding this rank's parameters.
            targets: module name in the model as built → that module on this rank, taken before any
                wrapper renamed it; a name missing (a pipeline stage's other layers) is drawn and dropped.

        Raises:
            UsageError: a tensor no step initialises.
        """
        for root in roots:
            ties = shared_parameters(root)
            root.to_empty(device=device)
            for ((owner, owner_name), *others), _ in ties:  # to_empty gave each alias a tensor of its own
                for alias, alias_name in others:
                    setattr(alias, alias_name, getattr(owner, owner_name))
        template = dict(self.template.named_modules())
        aliases = _aliases(self.template)
        torch.set_rng_state(self.rng_state)
        written: set[int] = set()
        for phase, steps in (("construction", self.construction), ("later", self.later)):
            for name, fn in steps:
                source = template[name]
                twin = _cpu_twin(source)
                before = {pname: t._version for pname, t in _own_tensors(twin).items()}
                fn(twin)
                for pname, full in _own_tensors(twin).items():
                    if full._version == before[pname]:
                        continue
                    # a tied tensor is reached by any of its names: a pipeline stage may hold it under another
                    names = aliases.get(id(getattr(source, pname)), [(name, pname)])
                    dst = next((d for d in (_target_tensor(targets, *n) for n in names) if d is not None), None)
                    # while constructing, a tied tensor keeps its first layer's values: the eager
                    # build drew the later layer's into a tensor the tie then dropped
                    if dst is None or (phase == "construction" and id(dst) in written):
                        continue
                    _write(dst, full)
                    written.add(id(dst))
        missing = [
            f"{name}.{pname}" if name else pname
            for root in roots
            for name, module in root.named_modules()
            for pname, t in _own_tensors(module).items()
            if id(t) not in written
        ]
        if missing:
            raise UsageError(f"no init step initialises {', '.join(missing[:5])} of the model built on the meta device")


def prepare_meta_init(model: nn.Module, rng_state: torch.Tensor | None = None) -> MetaInit:
    """The materialisation plan of `model` (on meta), taken before anything parallelises it.

    Args:
        rng_state: where drawing starts for a model of the user's; a registry-built model brings its own.
    """
    recorded = _RECORDED.get(model)
    extra: list[InitStep] = []
    if recorded is not None:
        rng_state, extra = recorded
    own = getattr(model, "init_steps", None)
    later = (list(own()) if callable(own) else []) + extra
    template = copy.deepcopy(model)
    return MetaInit(
        template=template,
        rng_state=(rng_state if rng_state is not None else torch.get_rng_state()).clone(),
        construction=construction_steps(template),
        later=later,
    )


def build_on_meta(builder: Callable[[], nn.Module]) -> tuple[nn.Module, MetaInit]:
    """Call a zero-argument model builder on the meta device; returns the model and its plan."""
    rng_state = torch.get_rng_state()
    with torch.device("meta"):
        model = builder()
    return model, prepare_meta_init(model, rng_state)
