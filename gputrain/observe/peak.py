"""The peak FLOP/s that MFU is measured against: the `gputrain bench` result cached for this
machine when there is one, else the datasheet figure of the GPU and dtype.

The peak table (`gputrain.env.peaks`) and the bench cache (`gputrain.bench.cache`) are imported
lazily and optionally, so a package without them still trains, just without MFU.
"""

from __future__ import annotations

import torch

# train.precision -> the dtype the matmuls run in. fp32 on CUDA really is fp32: the trainer turns
# TF32 off for it (see precision.py).
_MATMUL_DTYPE = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "fp16": "fp16"}


def device_name(device: torch.device) -> str:
    """The name the bench cache files results under (CUDA device name, or `cpu: <model> x<threads>`)."""
    try:
        from gputrain.bench.cache import device_name as bench_device_name
    except ImportError:
        bench_device_name = None
    if bench_device_name is not None:
        return bench_device_name(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}"


def resolve_peak(device: torch.device, precision: str) -> tuple[float | None, str | None]:
    """(peak FLOP/s of one device, where it comes from) for `precision` on `device`.

    Source is "bench" (the cached `gputrain bench` result for this machine, driver and torch) or
    "datasheet: ..." (the vendor's dense figure). (None, None) when neither is known — always the
    case on a CPU that has not been benchmarked: we do not guess a CPU peak.
    """
    dtype = _MATMUL_DTYPE.get(precision)
    if dtype is None:
        return None, None
    name = device_name(device)
    try:
        from gputrain.bench.cache import load_cached_peak
    except ImportError:
        load_cached_peak = None
    if load_cached_peak is not None:
        measured = load_cached_peak(name, dtype)
        if measured:
            return float(measured), "bench"
    if device.type != "cuda":
        return None, None
    try:
        from gputrain.env.peaks import datasheet_peak_flops
    except ImportError:
        return None, None
    found = datasheet_peak_flops(name, dtype)
    if found is None:
        return None, None
    peak, source = found
    return float(peak), f"datasheet: {source}"
