"""Run the microbenchmarks for one device and assemble the report (`gputrain bench`)."""

from __future__ import annotations

import torch

from gputrain.bench.cache import device_name
from gputrain.bench.conv import bench_conv2d, conv_dtypes
from gputrain.bench.dist_run import spawn_allreduce_benchmark
from gputrain.bench.matmul import bench_matmul, matmul_dtypes
from gputrain.bench.memory import bench_copy
from gputrain.bench.report import BenchReport, describe_device
from gputrain.bench.result import BenchResult, Settings, settings_for
from gputrain.bench.transfer import bench_transfers

__all__ = ["one_thread_matmuls", "run_benchmarks", "speedup_results"]


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
        out.append(
            BenchResult(
                "matmul_speedup_vs_cpu", device.type, f"{dtype} vs cpu fp32", f"{n}x{n}x{n}", gpu_value / cpu_fp32, "x"
            )
        )
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
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if gpus > 1:
        result, note = spawn_allreduce_benchmark("cuda", gpus, quick=quick)
        report.results.extend([result] if result else [])
        report.notes.extend([note] if note else [])
    else:
        report.notes.append(
            "all-reduce bandwidth needs more than one rank: on CPUs or across nodes "
            "run `torchrun --nproc-per-node N -m gputrain bench`"
        )
    return report


def one_thread_matmuls(quick: bool) -> tuple[str, list[BenchResult]]:
    """(the CPU's name with 1 thread, its matmul figures with 1 thread): what a run on a busy
    machine uses (env/threads.py picks 1 where the other cores are taken). Its per-thread figure
    is the highest there is, so scaled by a run's threads it is an upper bound (observe/peak.py)."""
    cpu = torch.device("cpu")
    settings = settings_for("cpu", quick)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return device_name(cpu), [bench_matmul(cpu, dtype, settings.matmul_n, settings) for dtype in matmul_dtypes(cpu)]
    finally:
        torch.set_num_threads(before)
