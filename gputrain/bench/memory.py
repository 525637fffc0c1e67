"""Device memory bandwidth: one large copy, counting the bytes read plus the bytes written."""

from __future__ import annotations

import torch

from gputrain.bench.result import BenchResult, Settings
from gputrain.bench.timing import measure

__all__ = ["bench_copy"]


def bench_copy(device: torch.device, settings: Settings) -> BenchResult:
    """B/s of `dst.copy_(src)` over `settings.copy_bytes` (far larger than any cache)."""
    nbytes = settings.copy_bytes
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        nbytes = min(nbytes, free // 4)  # two buffers, and room for whatever else is resident
    numel = nbytes // 4
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    timing = measure(lambda: dst.copy_(src), device, **settings.timing_kwargs())
    return BenchResult(
        "memory_copy", device.type, "fp32", f"{numel * 4 >> 20} MiB", 2 * numel * 4 / timing.median_s, "B/s"
    )
