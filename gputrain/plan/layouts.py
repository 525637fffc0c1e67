"""Per-device bytes of each layout (strategy × activation checkpointing × CPU offload), composed from
the measured step (`measure.py`): each phase's measured parts, divided where the layout shards them,
plus what the layout adds (DDP's gradient buckets, FSDP's gathered block).

none, ddp and fsdp are checked against measured runs (benchmarks/plan_accuracy.py); tp and pp are
modelled: tp shards the block weights and about half of the activations (the matmul outputs; norms and
residuals stay whole), pp keeps 1/pp of the weights and, under 1F1B, up to pp micro-batches in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputrain.plan.measure import Phase, StepMemory

STRATEGIES = ("none", "ddp", "fsdp", "tp", "pp", "hybrid")
USABLE_FRACTION = 0.85
"""Of the device's memory, what the plan lets a run use: the rest is the CUDA context, the
allocator's fragmentation and the headroom `batch_size=auto` leaves."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What sharding needs to know of the model besides the measured step."""

    largest_block_bytes: int
    """Parameters of the largest block (FSDP gathers one block at a time, and prefetches the next)."""
    outside_blocks_bytes: int
    """Parameters outside the blocks (embeddings, head): FSDP's root unit, gathered for the whole step."""
    has_blocks: bool


@dataclass(frozen=True, slots=True)
class LayoutBytes:
    strategy: str
    activation_checkpointing: str
    cpu_offload: bool
    weights: int
    gradients: int
    """At the peak (during backward only some gradients exist yet)."""
    optimizer: int
    activations: int
    buffers: int
    workspace: int
    """Temporaries, and gathered/bucketed copies the layout adds."""
    host: int = 0
    """Bytes kept in CPU memory instead (offload)."""

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers + self.workspace


def _activation_factor(strategy: str, degree: int, accum: int, schedule: str) -> float:
    if strategy == "tp":
        return 0.5 + 0.5 / degree
    if strategy == "pp":
        in_flight = accum if schedule == "gpipe" else min(degree, accum)
        return in_flight / degree
    return 1.0


def layout_bytes(
    step: StepMemory,
    shape: ModelShape,
    strategy: str,
    world: int,
    *,
    ac: str = "none",
    offload: bool = False,
    accum: int = 1,
    pp_schedule: str = "1f1b",
    param_bytes_factor: float = 1.0,
) -> LayoutBytes:
    """Bytes per device of one layout on `world` ranks, at the measured micro-batch.

    Args:
        step: measured with activation checkpointing `ac` already applied.
        param_bytes_factor: gathered parameters' size over their stored size (0.5 under bf16 FSDP).
    """
    shard = 1 if strategy in ("none", "ddp") else world
    sharded = strategy in ("fsdp", "hybrid")
    act = _activation_factor(strategy, world, accum, pp_schedule)
    gather = 0
    if sharded and (world > 1 or offload):
        block = shape.largest_block_bytes * param_bytes_factor
        # one block gathered, the next prefetched, its unsharded gradient before the reduce-scatter
        gather = int(2 * block + shape.outside_blocks_bytes * param_bytes_factor + shape.largest_block_bytes)

    def at(phase: Phase, activations: int, optimizer_phase: bool) -> LayoutBytes:
        states = (phase.weights, phase.gradients, phase.optimizer)
        w, g, o = (int(x / shard) for x in states)
        # the optimizer's temporaries are per parameter: sharded with them
        other = int(phase.other / shard) if optimizer_phase else int(phase.other * act)
        acts = 0 if optimizer_phase else min(other, int(activations * act))
        extra = 0 if optimizer_phase else gather
        if strategy == "ddp" and world > 1:
            extra += step.gradients  # the reducer's buckets hold a second copy of the gradients
        host = 0
        if offload and sharded:
            host, w, g, o = w + g + o, 0, 0, 0
        return LayoutBytes(strategy, ac, offload, w, g, o, acts, phase.buffers, other - acts + extra, host)

    fb = at(step.forward_backward, step.activations, False)
    opt = at(step.optimizer_step, 0, True)
    if offload and sharded:  # the optimizer steps on the CPU
        return fb
    return fb if fb.total >= opt.total else opt


def usable_bytes(device_bytes: int) -> int:
    return int(device_bytes * USABLE_FRACTION)
