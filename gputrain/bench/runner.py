"""Run the microbenchmarks for one device and assemble the report (`gputrain bench`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gputrain.bench.cache import device_name, driver_version, machine_key
from gputrain.bench.comms import bench_allreduce
from gputrain.bench.conv import bench_conv2d, conv_dtypes
from gputrain.bench.matmul import bench_matmul, matmul_dtypes
from gputrain.bench.memory import bench_copy
from gputrain.bench.result import BenchResult, Settings, settings_for
from gputrain.bench.transfer import bench_transfers

__all__ = ["BenchReport", "run_allreduce_benchmark", "run_benchmarks", "speedup_results"]


@dataclass
class BenchReport:
    """`--json` output: `{"device": {...}, "results": [...], "notes": [...]}`."""

    device: dict[str, Any]
    results: list[BenchResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "results": [r.to_dict() for r in self.results], "notes": self.notes}


def describe_device(device: torch.device, settings: Settings) -> dict[str, Any]:
    name = device_name(device)
    return {"type": device.type, "name": name,
            "driver": driver_version() if device.type == "cuda" else None,
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "mode": settings.mode, "key": machine_key(name)}


def speedup_results(device: torch.device, settings: Settings) -> list[BenchResult]:
    """GPU over CPU on the same n×n matmul: fp32 vs fp32, and bf16 on the GPU vs fp32 on the CPU
    (what moving a CPU fp32 training run to a GPU with bf16 autocast gains)."""
    n = min(settings.matmul_n, 2048 if settings.mode == "quick" else 4096)
    cpu = torch.device("cpu")
    cpu_settings = settings_for("cpu", quick=settings.mode != "full")
    cpu_fp32 = bench_matmul(cpu, "fp32", n, cpu_settings).value
    out = []
    for dtype in ("fp32", "bf16"):
        if dtype not in matmul_dtypes(device):
            continue
        gpu_value = bench_matmul(device, dtype, n, settings).value
        out.append(BenchResult("matmul_speedup_vs_cpu", device.type, f"{dtype} vs cpu fp32",
                               f"{n}x{n}x{n}", gpu_value / cpu_fp32, "x"))
    return out


def run_benchmarks(device: torch.device, *, quick: bool) -> BenchReport:
    """Every single-process benchmark on `device`: matmul per dtype, conv2d, memory copy,
    host↔device transfers and the GPU-over-CPU speed-up (the last two on CUDA only)."""
    settings = settings_for(device.type, quick)
    report = BenchReport(describe_device(device, settings))
    for dtype in matmul_dtypes(device):
        report.results.append(bench_matmul(device, dtype, settings.matmul_n, settings))
    for dtype in conv_dtypes(device):
        report.results.append(bench_conv2d(device, dtype, settings))
    report.results.append(bench_copy(device, settings))
    if device.type == "cuda":
        report.results.extend(bench_transfers(device, settings))
        report.results.extend(speedup_results(device, settings))
    else:
        report.notes.append("no GPU: host↔device transfers and the GPU-over-CPU speed-up are not measured")
    report.notes.append("all-reduce bandwidth needs more than one rank: run under "
                        "`torchrun --nproc-per-node N -m gputrain bench`")
    return report


def run_allreduce_benchmark(device_type: str, *, quick: bool) -> BenchReport | None:
    """Under torchrun (WORLD_SIZE > 1): all-reduce bus bandwidth; the report on rank 0 only."""
    use_cuda = device_type == "cuda"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(minutes=2))
    try:
        settings = settings_for(device.type, quick)
        result = bench_allreduce(device, settings)
        if dist.get_rank() != 0:
            return None
        report = BenchReport(describe_device(device, settings))
        if result is not None:
            report.results.append(result)
        return report
    finally:
        dist.destroy_process_group()
