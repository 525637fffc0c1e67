"""parallel.strategy=auto: pick the cheapest layout whose estimated memory per rank fits the device.

Estimate per rank (bytes): weights (fp32 master copy), gradients (fp32), optimizer state (by
optimizer: Adam-family 2 fp32 tensors per parameter, SGD with momentum 1, ...), and activations
saved for the backward pass at the micro-batch, measured by a forward pass on the meta device
(no memory, no compute). Candidates, cheapest first: one device; DDP (every rank holds a
replica); FSDP (weights, gradients and optimizer state divided by the ranks); then FSDP (or one
device) with selective, then full, activation checkpointing. The first that fits within 85% of
the device's memory wins (the rest is the CUDA context, the allocator's slack, temporaries).

This quick estimate settles a replicated layout that fits with room to spare (`CLEAR_FIT`); any
closer call is decided by the memory plan (gputrain.plan: one step measured on fake tensors), whose
candidates and usable share these are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from gputrain.config.memory_limit import MemoryLimit, rank_memory_limit
from gputrain.distributed.ac import ACMode
from gputrain.distributed.parallel_dims import Strategy
from gputrain.optim.states import optimizer_states_per_param
from gputrain.plan.layouts import USABLE_FRACTION
from gputrain.plan.planner import Row, auto_candidates, pick_layout

if TYPE_CHECKING:
    from gputrain.config.schema import Config

CLEAR_FIT = 0.25
"""auto: a replicated layout whose quick estimate needs at most this share of the usable memory
is chosen without measuring the plan's fake training steps."""
# Share of the activations still held with checkpointing: selective keeps the matmul outputs (about
# half of a transformer block's saved bytes); full keeps only each block's input.
_AC_KEEP = {"none": 1.0, "selective": 0.5, "full": 0.15}
GIB = 1024**3
UNKNOWN_MEMORY = 1 << 50
"""Assumed where no memory limit can be read (no sysconf, no cgroup, no rlimit): 1 PiB, no bound."""


@dataclass(slots=True)
class StrategyChoice:
    strategy: Strategy
    """none, ddp, fsdp, tp, pp or hybrid (auto resolved)."""
    activation_checkpointing: ACMode
    reason: str | None = None
    """For auto: the numbers behind the choice, printed at start."""


def choose_strategy(
    config: Config, model: nn.Module, world_size: int, device: torch.device, sample: torch.Tensor | None
) -> StrategyChoice:
    """The configured strategy, or for `auto` the one the memory estimate picks.

    Args:
        sample: one input sample as the model receives it (shape and dtype matter), or None when
            the data has none to show; the activations are then left out of the estimate.
    """
    par = config.parallel
    if par.strategy == "tuned":  # the command line resolves it (cli/train.py) before anything is built
        from gputrain.errors import ConfigError

        raise ConfigError(
            "parallel.strategy",
            "tuned is applied by `gputrain train` (it reads the tune file); give the layout here",
            "tuned",
            hint="use auto, or the overrides gputrain tune printed",
        )
    if par.strategy != "auto":
        return StrategyChoice(par.strategy, par.activation_checkpointing)
    return choose_auto(config, model, world_size, device, sample)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    num_params: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    """Saved for backward at one micro-batch, on one rank, without checkpointing."""
    micro_batch: int
    activations_measured: bool = True
    """False where the model could not run on the meta device: activation_bytes is then 0."""

    @property
    def state_bytes(self) -> int:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    def per_rank(self, strategy: str, world_size: int, ac: str = "none") -> float:
        states = self.state_bytes / world_size if strategy == "fsdp" else self.state_bytes
        return states + self.activation_bytes * _AC_KEEP[ac]


def activation_bytes(model: nn.Module, sample: torch.Tensor, micro_batch: int) -> int | None:
    """Bytes the forward pass saves for backward at `micro_batch`, measured on the meta device;
    None for a model that cannot run there (its Python code reads tensor values, as some Hugging
    Face models' input checks do).

    The model's parameters are swapped for meta tensors with `functional_call`, so nothing is
    copied or computed; parameters saved by matmuls are not counted (they are the weights)."""
    meta = {
        name: torch.empty_like(t, device="meta", requires_grad=t.requires_grad)
        for name, t in [*model.named_parameters(), *model.named_buffers()]
    }
    param_ids = {id(t) for t in meta.values()}
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        base = t._base if t._base is not None else t
        if id(t) not in seen and id(base) not in param_ids:
            seen.add(id(t))
            total += t.numel() * t.element_size()
        return t

    batch = torch.empty((micro_batch, *sample.shape), dtype=sample.dtype, device="meta")
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            torch.func.functional_call(model, meta, (batch,))
    except Exception:  # noqa: BLE001 - any failure of the model's own code on meta tensors
        return None
    return total


def estimate_memory(
    model: nn.Module,
    sample: torch.Tensor | None,
    micro_batch: int,
    optimizer: str,
    momentum: float = 0.0,
    precision: str = "fp32",
) -> MemoryEstimate:
    """Weights, gradients, optimizer state and activations of `model` at `micro_batch` samples."""
    n = sum(p.numel() for p in model.parameters())
    measured = activation_bytes(model, sample, micro_batch) if sample is not None else None
    acts = measured or 0  # unknown activations: the estimate holds the states only (explain() says so)
    if precision in ("bf16", "fp16"):
        acts //= 2  # autocast saves most activations in half precision
    return MemoryEstimate(
        num_params=n,
        weights_bytes=4 * n,
        grads_bytes=4 * n,
        optimizer_bytes=4 * n * optimizer_states_per_param(optimizer, momentum),
        activation_bytes=acts,
        micro_batch=micro_batch,
        activations_measured=measured is not None,
    )


def decide(est: MemoryEstimate, world_size: int, device_bytes: int) -> tuple[Strategy, ACMode, bool]:
    """(strategy, activation_checkpointing, fits) — the first candidate within the usable memory."""
    budget = device_bytes * USABLE_FRACTION
    candidates = auto_candidates(world_size)
    for strategy, ac in candidates:
        if est.per_rank(strategy, world_size, ac) <= budget:
            return strategy, ac, True
    return (*candidates[-1], False)


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def explain(
    est: MemoryEstimate,
    world_size: int,
    device_bytes: int,
    strategy: str,
    ac: str,
    fits: bool,
    optimizer: str,
    binding: str = "device",
) -> str:
    """The numbers behind the choice, in one line; `binding`: what limits `device_bytes`."""
    gib = format_bytes
    shard = f" (÷{world_size} sharded)" if strategy == "fsdp" else ""
    line = (
        f"auto: {format_count(est.num_params)} parameters; per rank: weights {gib(est.weights_bytes)}, gradients "
        f"{gib(est.grads_bytes)}, {optimizer} state {gib(est.optimizer_bytes)}{shard}, activations "
        + (
            f"{gib(est.activation_bytes * _AC_KEEP[ac])} at micro-batch {est.micro_batch}"
            if est.activations_measured
            else "not measured (the model does not run on the meta device)"
        )
        + f"{f' with {ac} checkpointing' if ac != 'none' else ''} = "
        f"{gib(est.per_rank(strategy, world_size, ac))} of {gib(device_bytes * USABLE_FRACTION)} usable "
        f"{_of(device_bytes, binding)}"
    )
    if strategy == "fsdp" and fits:
        line += f"; a DDP replica would need {gib(est.per_rank('ddp', world_size))}"
    if not fits:
        line += (
            "; DOES NOT FIT even so: use more ranks, a smaller train.micro_batch_size, "
            "parallel.cpu_offload=true or train.precision=bf16"
        )
    return line


def device_memory(device: torch.device, ranks: int | None = None) -> MemoryLimit:
    """Memory one rank can use, and what binds it (config/memory_limit.py): the GPU's, or on CPU the
    lowest of this process's own limits and its share of what the `ranks` of this node share
    (default: LOCAL_WORLD_SIZE)."""
    limit = rank_memory_limit(device if device.type == "cuda" else None, ranks)
    return limit if limit is not None else MemoryLimit(UNKNOWN_MEMORY, "no limit could be read")


def choose_auto(
    config: Config, model: nn.Module, world_size: int, device: torch.device, sample: torch.Tensor | None
) -> StrategyChoice:
    """Resolve parallel.strategy=auto for this model, job and device, from the memory plan (one step
    measured on fake tensors, `gputrain.plan`); the states-only estimate where the model cannot run
    on fake tensors or there is no sample."""
    from gputrain.plan.targets import build_target

    per_rank_batch = max(1, int(config.train.batch_size) // world_size)
    accum = config.train.grad_accum if isinstance(config.train.grad_accum, int) else 1
    given_micro = config.train.micro_batch_size
    micro = given_micro if isinstance(given_micro, int) else max(1, per_rank_batch // accum)
    precision = (
        config.train.precision if config.train.precision != "auto" else ("bf16" if device.type == "cuda" else "fp32")
    )
    limit = device_memory(device)
    device_bytes = limit.bytes
    given = config.parallel.activation_checkpointing  # an explicit setting wins over either choice
    est = estimate_memory(model, sample, micro, config.optim.name, config.optim.momentum, precision)
    strategy, ac, fits = decide(est, world_size, device_bytes)
    ac = given if given != "none" else ac
    quick = StrategyChoice(
        strategy, ac, explain(est, world_size, device_bytes, strategy, ac, fits, config.optim.name, limit.what)
    )
    if (
        est.activations_measured
        and strategy in ("none", "ddp")
        and est.per_rank(strategy, world_size, ac) <= CLEAR_FIT * USABLE_FRACTION * device_bytes
    ):
        # far from the limit, the states plus a meta forward's activations settle it: the plan's
        # fake training steps (seconds) would only confirm what every run would pay for at start
        return quick
    if sample is not None:
        target = build_target(config, model, (sample,), device, precision)
        row, measured = pick_layout(target, micro, world_size, device_bytes)
        if measured:
            layout = row.layout
            return StrategyChoice(
                layout.strategy,
                given if given != "none" else layout.activation_checkpointing,
                explain_layout(row, micro, device_bytes, limit.what),
            )
    return quick


def _of(device_bytes: int, binding: str) -> str:
    """'(80.00 GiB device)', or what binds a rank's memory: '(2.10 GiB: this process's address-space limit ...)'."""
    return (
        f"({format_bytes(device_bytes)} device)"
        if binding == "device"
        else f"({format_bytes(device_bytes)}: {binding})"
    )


def explain_layout(row: Row, micro: int, device_bytes: int, binding: str = "device") -> str:
    """The planned bytes behind auto's choice, in one line; `binding`: what limits `device_bytes`."""
    lay = row.layout
    ac = f" with {lay.activation_checkpointing} checkpointing" if lay.activation_checkpointing != "none" else ""
    line = (
        f"auto: {lay.strategy}{ac} (memory plan, micro-batch {micro}, per rank): weights {format_bytes(lay.weights)}, "
        f"gradients {format_bytes(lay.gradients)}, optimizer {format_bytes(lay.optimizer)}, activations "
        f"{format_bytes(lay.activations)}, workspace {format_bytes(lay.workspace)} = {format_bytes(lay.total)} of "
        f"{format_bytes(device_bytes * USABLE_FRACTION)} usable {_of(device_bytes, binding)}"
    )
    if not row.fits:
        line += (
            "; DOES NOT FIT even so: use more ranks, a smaller train.micro_batch_size, "
            "parallel.cpu_offload=true or train.precision=bf16 (gputrain plan shows every layout)"
        )
    return line
