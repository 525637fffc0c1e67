"""Host↔device copies, from pageable and from pinned host memory.

Pageable memory is staged through a driver-owned pinned buffer, so it is typically half the
speed of pinned memory: the reason `DataLoader(pin_memory=True)` matters.
"""

from __future__ import annotations

import torch

from gputrain.bench.result import BenchResult, Settings
from gputrain.bench.timing import measure

__all__ = ["bench_transfers"]


def bench_transfers(device: torch.device, settings: Settings) -> list[BenchResult]:
    """h2d and d2h B/s, pageable and pinned (CUDA only: there is no transfer on a CPU)."""
    if device.type != "cuda":
        return []
    numel = settings.transfer_bytes // 4
    dev = torch.randn(numel, device=device)
    results = []
    for pinned in (False, True):
        host = torch.randn(numel)
        if pinned:
            host = host.pin_memory()
        label = "pinned" if pinned else "pageable"
        for direction, fn in (
            ("h2d", lambda host=host, pinned=pinned: dev.copy_(host, non_blocking=pinned)),
            ("d2h", lambda host=host, pinned=pinned: host.copy_(dev, non_blocking=pinned)),
        ):
            timing = measure(fn, device, **settings.timing_kwargs())
            results.append(
                BenchResult(
                    f"{direction}_{label}",
                    device.type,
                    "fp32",
                    f"{numel * 4 >> 20} MiB",
                    numel * 4 / timing.median_s,
                    "B/s",
                )
            )
    return results
