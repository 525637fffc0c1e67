"""Matmul throughput per dtype: the measured peak that MFU can be compared against."""

from __future__ import annotations

import torch

from gputrain.bench.precision import fp32_precision
from gputrain.bench.result import BenchResult, Settings
from gputrain.bench.timing import measure

__all__ = ["DTYPES_CPU", "DTYPES_CUDA", "bench_matmul", "matmul_dtypes"]

DTYPES_CUDA = ("fp32", "tf32", "bf16", "fp16")
DTYPES_CPU = ("fp32", "bf16")
_TORCH_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def matmul_dtypes(device: torch.device) -> tuple[str, ...]:
    """The dtypes worth measuring on `device` (bf16/tf32 only where the GPU has them)."""
    if device.type != "cuda":
        return DTYPES_CPU
    major, _ = torch.cuda.get_device_capability(device)
    return DTYPES_CUDA if major >= 8 else ("fp32", "fp16")


def bench_matmul(device: torch.device, dtype: str, n: int, settings: Settings) -> BenchResult:
    """FLOP/s of an n×n by n×n matmul (2·n³ FLOPs) in `dtype`, median of repeats."""
    torch_dtype = _TORCH_DTYPE[dtype]
    # Random inputs: zeros or constants let hardware and libraries take shortcuts, and a
    # zero-filled operand can draw less power and clock higher than real data does.
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    out = torch.empty(n, n, device=device, dtype=torch_dtype)
    # "fp32" must mean IEEE FP32 and "tf32" tensor cores, whatever the process default is.
    with fp32_precision("tf32" if dtype == "tf32" else "ieee"):
        timing = measure(lambda: torch.matmul(a, b, out=out), device, **settings.timing_kwargs())
    return BenchResult("matmul", device.type, dtype, f"{n}x{n}x{n}", 2 * n**3 / timing.median_s, "FLOP/s")
