"""The peak FLOP/s that MFU is measured against: the `gputrain bench` result cached for this
machine when there is one, else the datasheet figure of the GPU and dtype.

A CPU's peak depends on the threads a run uses, which it picks from the load when it starts
(env/threads.py): 1 on a busy machine where `gputrain bench` measured 2. The peak measured with
the run's own count is used; else the best per-thread figure measured (bench measures 1 thread
too) times the run's threads: an upper bound, since threads never add more than their share, so
MFU against it is never overstated."""

from __future__ import annotations

import torch

from gputrain.bench.cache import cpu_peaks_by_threads, device_name, load_cached, load_cached_peak
from gputrain.env.peaks import datasheet_peak_flops

# train.precision -> the dtype the matmuls run in. fp32 on CUDA really is fp32: the trainer turns
# TF32 off for it (see precision.py).
# fp8 is measured against the float8 peak, although only its large Linear layers run in float8.
_MATMUL_DTYPE = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}


def resolve_peak(device: torch.device, precision: str) -> tuple[float | None, str | None]:
    """(peak FLOP/s of one device, where it comes from) for `precision` on `device`.

    Source is "bench" (the cached `gputrain bench` result for this machine, driver and torch) or
    "datasheet: ..." (the vendor's dense figure). (None, None) when neither is known — always the
    case on a CPU that has not been benchmarked: we do not guess a CPU peak.
    """
    dtype = _MATMUL_DTYPE.get(precision)
    if dtype is None:
        return None, None
    if device.type == "cpu":
        return _cpu_peak(dtype, torch.get_num_threads())
    name = device_name(device)
    measured = load_cached_peak(name, dtype)
    if measured:
        suspect = (load_cached(name) or {}).get("peaks_suspect")
        return float(measured), f"bench ({suspect}: it may be too low)" if suspect else "bench"
    if device.type != "cuda":
        return None, None
    found = datasheet_peak_flops(name, dtype, sm_count=_sm_count(device))
    if found is None:
        return None, None
    peak, source = found
    return float(peak), f"datasheet: {source}"


def _cpu_peak(dtype: str, threads: int) -> tuple[float | None, str | None]:
    """The CPU's peak with `threads` threads: measured with that count, else scaled from the
    count whose per-thread figure is highest (see the module docstring)."""
    measured = cpu_peaks_by_threads(dtype)
    if not measured:
        return None, None
    if threads in measured:
        peak, suspect = measured[threads]
        source = "bench"
    else:
        count = max(measured, key=lambda n: measured[n][0] / n)
        per_thread, suspect = measured[count][0] / count, measured[count][1]
        peak = per_thread * threads
        source = f"bench ({_threads(count)} measured, scaled to {threads})"
    return peak, f"{source} ({suspect}: it may be too low)" if suspect else source


def _threads(count: int) -> str:
    return f"{count} thread{'s' if count != 1 else ''}"


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors this process can use: fewer than the product's on a MIG slice."""
    return int(torch.cuda.get_device_properties(device).multi_processor_count)
