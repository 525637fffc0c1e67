"""The advisor: measured facts about a run in, findings out — what is slow, the evidence, what to change.

Facts are data (`RunFacts`, filled by the profiler or by hand in tests); each rule is a small
function `facts -> Finding | None`. Thresholds are module constants so they are easy to find.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

DATA_BOUND_FRACTION = 0.15
"""The device waiting this share of a step for data is worth fixing."""
SHORT_KERNEL_US = 10.0
LAUNCH_BOUND_KERNELS = 500
"""This many kernels of < SHORT_KERNEL_US per step: the host's launch rate, not the GPU, sets the pace."""
FP32_MATMUL_SHARE = 0.2
"""Share of device time in fp32 matmul/conv kernels worth moving to tensor cores."""
COMM_BOUND_FRACTION = 0.2
"""A step waiting this share of its time for gradient communication is worth fixing."""
LOW_UTILISATION = 0.5
"""Device busy less than this share of a step (and not waiting for data): the work is too small."""


@dataclass(frozen=True, slots=True)
class Finding:
    bottleneck: str
    """What limits the speed, in a few words."""
    evidence: str
    """The measurement that shows it."""
    change: str
    """The config change (or code change) to make."""

    def __str__(self) -> str:
        return f"{self.bottleneck}: {self.evidence} → {self.change}"


@dataclass(slots=True)
class RunFacts:
    """What was measured over the profiled steps (None: not measured on this device)."""

    device_type: str
    precision: str
    batch_size: int
    step_time_s: float
    data_fraction: float | None = None
    """Share of a step spent waiting for the next batch (from the step-time breakdown)."""
    num_workers: int = 0
    pin_memory: bool = False
    loader_workers_apply: bool = True
    """False for in-memory tensor data, which is indexed in the main process and needs no workers."""
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    kernels_per_step: float | None = None
    short_kernels_per_step: float | None = None
    compiled: bool = False
    tensor_cores: bool = False
    fp32_matmul_share: float | None = None
    """Share of device time in matmul/conv kernels that ran in fp32."""
    syncs_per_step: float | None = None
    """The user's host-device syncs per step (`.item()`, `.cpu()`, `.tolist()`, printing a tensor ...)."""
    own_syncs_per_step: float | None = None
    """gputrain's own syncs per step: logging steps' reads, and the host-side non-finite guard's flag."""
    device_utilisation: float | None = None
    """Share of the step's wall time the device is busy with kernels."""
    conv_net: bool = False
    channels_last: bool = False
    comm_fraction: float | None = None
    """Share of a step waiting for data-parallel gradient communication after the backward pass."""
    strategy: str = "none"
    """parallel.strategy as resolved for the run."""
    grad_accum: int = 1
    fp8: dict[str, Any] | None = None
    """precision=fp8: which Linear layers went to float8 (fp8.py's Fp8Plan.to_dict); None otherwise."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_data_bound(f: RunFacts) -> Finding | None:
    if f.data_fraction is None or f.data_fraction < DATA_BOUND_FRACTION:
        return None
    evidence = (
        f"the {'device' if f.device_type == 'cuda' else 'training'} waits for data "
        f"{100 * f.data_fraction:.0f}% of each step"
    )
    if not f.loader_workers_apply:
        return Finding("data-bound", evidence, "make the per-sample work cheaper, or precompute the data set")
    workers = min(max(f.cpu_count - 1, 1), max(4, 2 * f.num_workers))
    change = (
        f"data.num_workers={workers} ({f.num_workers} now)"
        if workers > f.num_workers
        else "cheaper __getitem__ (decode/augment on the device with data.augment)"
    )
    if f.device_type == "cuda" and not f.pin_memory:
        change += ", pinned memory"
    return Finding("data-bound", evidence, change)


def check_launch_bound(f: RunFacts) -> Finding | None:
    if f.device_type != "cuda" or f.short_kernels_per_step is None or f.short_kernels_per_step < LAUNCH_BOUND_KERNELS:
        return None
    change = (
        "train.cuda_graphs=true (the graph replays the launches)"
        if f.compiled
        else "train.compile=true or a larger batch"
    )
    return Finding(
        "launch-bound", f"{f.short_kernels_per_step:,.0f} kernels of < {SHORT_KERNEL_US:g} µs per step", change
    )


def check_fp32_matmuls(f: RunFacts) -> Finding | None:
    if f.device_type != "cuda" or not f.tensor_cores or f.precision not in ("fp32", "auto"):
        return None
    if f.fp32_matmul_share is None or f.fp32_matmul_share < FP32_MATMUL_SHARE:
        return None
    return Finding(
        "fp32 matmuls on a GPU with tensor cores",
        f"{100 * f.fp32_matmul_share:.0f}% of device time in fp32 matmul/conv kernels",
        "train.precision=bf16 (or tf32 to keep fp32 storage)",
    )


def check_host_syncs(f: RunFacts) -> Finding | None:
    if f.device_type != "cuda" or f.syncs_per_step is None or f.syncs_per_step < 1:
        return None
    return Finding(
        "host sync every step",
        f"{f.syncs_per_step:.1f} host-device syncs per step (.item(), .cpu(), .tolist() or printing a tensor)",
        "remove the .item() (or similar) from your step_fn / loss_fn; gputrain logs the loss itself",
    )


def check_own_syncs(f: RunFacts) -> Finding | None:
    """gputrain's own reads belong to logging steps; one every step is the host-side guard's."""
    if f.device_type != "cuda" or f.own_syncs_per_step is None or f.own_syncs_per_step < 1:
        return None
    return Finding(
        "gputrain syncs every step",
        f"{f.own_syncs_per_step:.1f} of gputrain's own host-device syncs per step: the non-finite guard reads its "
        "flag on the host because the optimizer cannot skip an update on the device (no fused kernel, sharded or "
        "pipelined parameters, or an fp16 GradScaler) or train.on_nonfinite=skip, or log.every_steps is 1",
        "optim.name=adamw, adam or sgd (fused), bf16 rather than fp16, a larger log.every_steps, "
        "train.on_nonfinite=stop, or train.on_nonfinite=off to drop the check",
    )


def check_utilisation(f: RunFacts) -> Finding | None:
    if f.device_type != "cuda" or f.device_utilisation is None or f.device_utilisation >= LOW_UTILISATION:
        return None
    if f.data_fraction is not None and f.data_fraction >= DATA_BOUND_FRACTION:
        return None  # the data finding explains the idle device
    if f.comm_fraction is not None and f.comm_fraction >= COMM_BOUND_FRACTION:
        return None  # so does the communication finding
    return Finding(
        "batch too small to fill the GPU",
        f"utilisation {100 * f.device_utilisation:.0f}%",
        f"train.batch_size={2 * f.batch_size} or more ({f.batch_size} now), or train.compile=true",
    )


def check_channels_last(f: RunFacts) -> Finding | None:
    if f.device_type != "cuda" or not f.conv_net or f.channels_last:
        return None
    return Finding(
        "conv net not in channels_last",
        "convolution weights are in NCHW (contiguous) layout",
        "channels_last memory format (gputrain applies it to conv nets on CUDA by default; "
        "a user DataLoader should also yield channels_last images)",
    )


def check_comm_bound(f: RunFacts) -> Finding | None:
    if f.comm_fraction is None or f.comm_fraction < COMM_BOUND_FRACTION:
        return None
    # each optimizer step pays one gradient exchange: more samples per step spread it thinner
    change = f"train.grad_accum={2 * f.grad_accum} ({f.grad_accum} now) or a larger train.batch_size"
    if f.strategy in ("fsdp", "hybrid"):
        change += (
            "; if the model fits on one device, parallel.strategy=ddp (one all-reduce instead of "
            "all-gathers and reduce-scatters)"
        )
    return Finding(
        "communication-bound",
        f"the step waits for gradient communication {100 * f.comm_fraction:.0f}% of its time",
        change,
    )


def check_fp8_pays(f: RunFacts) -> Finding | None:
    """fp8 whose plan leaves too little in float8 to gain: decided from the layers' shapes (torchao's
    thresholds), so it holds on any device, before a GPU measures it."""
    plan = f.fp8
    if f.precision != "fp8" or plan is None or plan.get("expected_to_pay", True):
        return None
    skipped = ", ".join(f"{len(names)} {reason}" for reason, names in sorted(plan["skipped"].items()))
    return Finding(
        "fp8 not expected to pay",
        f"{plan['converted']} of {plan['linear_layers']} Linear layers in float8 ({plan['recipe']}; bf16: {skipped}); "
        f"{plan['expectation']}",
        "train.precision=bf16 (float8 pays where most of the matmul work is in large layers: d_model 2048 and up)",
    )


RULES: tuple[Callable[[RunFacts], Finding | None], ...] = (
    check_data_bound,
    check_comm_bound,
    check_launch_bound,
    check_fp32_matmuls,
    check_host_syncs,
    check_own_syncs,
    check_utilisation,
    check_channels_last,
    check_fp8_pays,
)


def advise(facts: RunFacts) -> list[Finding]:
    """Every rule's finding, in the order above (the biggest usual bottlenecks first)."""
    return [finding for rule in RULES if (finding := rule(facts)) is not None]
