"""Per-device bytes of each layout (strategy × activation checkpointing × CPU offload), composed from
the measured step (`measure.py`): each phase's measured parts, divided where the layout shards them,
plus what the layout adds (DDP's gradient buckets, FSDP's gathered blocks), at the point of the
forward/backward pass where the layout's own sum peaks (the measured frontier of gradients against
activations and temporaries).

Checked against the CPU allocator's peak in real runs of the Trainer, 1 and 2 gloo ranks
(benchmarks/plan_accuracy.py, RESULTS.md). pp is measured stage by stage (pipeline.py) where the
schedule is 1F1B or GPipe; tp is modelled: it shards the weights and about half of the activations
(the matmul outputs; norms and residuals stay whole), and so is interleaved pp: 1/pp of the weights
and up to pp micro-batches in flight.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gputrain.distributed.ac import ACMode
from gputrain.distributed.parallel_dims import Strategy
from gputrain.plan.measure import StepMemory

STRATEGIES: tuple[Strategy, ...] = ("none", "ddp", "fsdp", "tp", "pp", "hybrid")
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
    second_block_bytes: int = -1
    """Parameters of the second largest block: the most the block FSDP prefetches beside the largest
    can hold (-1: as the largest)."""


@dataclass(frozen=True, slots=True)
class LayoutBytes:
    strategy: Strategy
    activation_checkpointing: ACMode
    cpu_offload: bool
    weights: int
    gradients: int
    """At the peak (during backward only some gradients exist yet)."""
    optimizer: int
    activations: int
    """Saved for backward at the peak, and the step's input micro-batches."""
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


def _fsdp_gather(shape: ModelShape, param_bytes_factor: float) -> int:
    """What FSDP holds unsharded besides the sharded states: the root unit (gathered for the whole
    step), the block being computed and the one prefetched beside it, and the block's unsharded
    gradient before its reduce-scatter."""
    if not shape.has_blocks:  # one unit: the whole model gathered, and its whole gradient
        return int(shape.outside_blocks_bytes * (param_bytes_factor + 1))
    block = shape.largest_block_bytes
    second = block if shape.second_block_bytes < 0 else shape.second_block_bytes
    return int((block + second + shape.outside_blocks_bytes) * param_bytes_factor + block)


def layout_bytes(
    step: StepMemory,
    shape: ModelShape,
    strategy: Strategy,
    world: int,
    *,
    ac: ACMode = "none",
    offload: bool = False,
    accum: int = 1,
    pp_schedule: str = "1f1b",
    param_bytes_factor: float = 1.0,
    stages: list[StepMemory] | None = None,
    host_is_device: bool = False,
) -> LayoutBytes:
    """Bytes per device of one layout on `world` ranks, at the measured micro-batch.

    Args:
        step: measured with activation checkpointing `ac` already applied, over the step's `accum`
            micro-batches.
        param_bytes_factor: gathered parameters' size over their stored size (0.5 under bf16 FSDP).
        stages: pp only: each stage's step, measured through its part of the schedule
            (pipeline.py); the row is the stage that needs the most. None: pp is modelled.
        host_is_device: the device's memory is the host's (a CPU job): offload moves nothing off
            it, and its row is the one without offload (FSDP2's CPUOffloadPolicy keeps the shards
            where they already are; tests/dist/test_plan_memory.py measures both alike).
    """
    if strategy == "pp" and stages:
        rows = [_compose(s, "pp", 1, 1.0, 1.0, 0, ac, False) for s in stages]
        return max(rows, key=lambda r: r.total)
    shard = 1 if strategy in ("none", "ddp") else world
    sharded = strategy in ("fsdp", "hybrid")
    act = _activation_factor(strategy, world, accum, pp_schedule)
    # gradients: sharded with the weights, except FSDP's while micro-batches accumulate (without
    # gradient sync each rank keeps the whole model's unsharded gradients until the last one)
    grad_scale = 1.0 if sharded and step.accum > 1 else 1 / shard
    extra = 0
    if sharded and (world > 1 or offload):
        extra = _fsdp_gather(shape, param_bytes_factor)
    if strategy == "ddp" and world > 1:
        extra += step.gradients  # the reducer's buckets hold a second copy of the gradients
    row = _compose(step, strategy, shard, grad_scale, act, extra, ac, offload and sharded and not host_is_device)
    return dataclasses.replace(row, cpu_offload=offload and sharded)


def _compose(
    step: StepMemory,
    strategy: Strategy,
    shard: int,
    grad_scale: float,
    act: float,
    extra: int,
    ac: ACMode,
    offload: bool,
) -> LayoutBytes:
    """The larger of the layout's forward/backward peak (the frontier point where its own sum is
    largest) and its optimizer-step peak."""
    fb_phase = step.forward_backward
    inputs = step.inputs * step.accum  # the loop holds the step's micro-batches through it
    points = step.frontier or ((fb_phase.gradients, fb_phase.other),)
    grads, other = max(points, key=lambda p: p[0] * grad_scale + p[1] * act)
    w, o = int(fb_phase.weights / shard), int(fb_phase.optimizer / shard)
    g, other = int(grads * grad_scale), int(other * act)
    acts = min(other, int(step.activations * act))
    host = 0
    if offload:
        host, w, g, o = w + g + o, 0, 0, 0
    fb = LayoutBytes(strategy, ac, offload, w, g, o, acts + inputs, fb_phase.buffers, other - acts + extra, host)
    if offload:  # the optimizer steps on the CPU
        return fb
    # the optimizer's temporaries are per parameter: sharded with them
    p = step.optimizer_step
    opt = LayoutBytes(
        strategy,
        ac,
        offload,
        int(p.weights / shard),
        int(p.gradients / shard),
        int(p.optimizer / shard),
        inputs,
        p.buffers,
        int(p.other / shard),
        host,
    )
    return fb if fb.total >= opt.total else opt


def usable_bytes(device_bytes: int) -> int:
    return int(device_bytes * USABLE_FRACTION)
