"""All-reduce bus bandwidth across the ranks of an initialised process group.

Bus bandwidth is NCCL-tests' figure: algorithm bandwidth (bytes / time) times 2·(n−1)/n, the
share of the data each link carries in a ring all-reduce, so it is comparable across rank counts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gputrain.bench.result import BenchResult, Settings
from gputrain.bench.timing import measure, rank_clock
from gputrain.distributed.context import agreed_count

__all__ = ["bench_allreduce", "bus_bandwidth"]


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> float:
    """NCCL-tests bus bandwidth of an all-reduce of `nbytes` that took `seconds`."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size


def bench_allreduce(device: torch.device, settings: Settings) -> BenchResult | None:
    """Bus B/s of a sum all-reduce, or None when there is only one rank."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    world = dist.get_world_size()
    numel = settings.allreduce_bytes // 4
    tensor = torch.randn(numel, device=device)

    # The sum grows world× per call; the values may overflow to inf, which costs the same to
    # reduce, so nothing rescales them inside the timed loop.
    # Every rank runs rank 0's count of calls: counts from each rank's own clock differ, and a rank
    # that runs one more all-reduce than its peer meets the 4-byte one below with it.
    timing = measure(
        lambda: dist.all_reduce(tensor),
        device,
        **settings.timing_kwargs(),
        clock=rank_clock(dist.get_rank()),
        agree=lambda count: agreed_count(count, device),
    )
    # A rank's own timing can differ; the slowest rank is what training waits for.
    worst = torch.tensor([timing.median_s], device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return BenchResult(
        "allreduce_busbw",
        f"{device.type} x{world} ({dist.get_backend()})",
        "fp32",
        f"{numel * 4 >> 20} MiB",
        bus_bandwidth(numel * 4, float(worst.item()), world),
        "B/s",
    )
