"""Shared by the benchmarks: CUDA check, registry look-ups that explain what is missing, timing
of a hand-written loop in windows of steps bracketed by device syncs, and a run's CPU and wall time."""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
T = TypeVar("T")


def require_cuda(name: str) -> torch.device:
    if not torch.cuda.is_available():
        print(
            f"{name}: skipped — no CUDA device (torch {torch.__version__}); this benchmark measures GPU "
            "throughput and runs only on CUDA"
        )
        raise SystemExit(0)
    return torch.device("cuda", 0)


def require_registered(model: str | None = None, data: str | None = None) -> None:
    from gputrain.data.registry import available_data
    from gputrain.models.registry import available_models

    missing = [f"model {model!r}" for _ in [0] if model and model not in available_models()]
    missing += [f"data source {data!r}" for _ in [0] if data and data not in available_data()]
    if missing:
        print(f"skipped — {' and '.join(missing)} not registered in this checkout of gputrain")
        raise SystemExit(0)


def sync() -> None:
    """Wait for the GPU, if there is one (gpu_proof.py --dry-run times the same code on a CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_memory(reset: bool = False) -> int:
    """The CUDA allocator's peak since the last reset (0 on a CPU); `reset` starts a new window."""
    if not torch.cuda.is_available():
        return 0
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return int(torch.cuda.max_memory_allocated())


def time_windows(step: Callable[[], None], warmup: int, windows: int, per_window: int) -> list[float]:
    """Seconds per step of `windows` windows of `per_window` steps each, after `warmup` steps."""
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(per_window):
            step()
        sync()
        times.append((time.perf_counter() - start) / per_window)
    return times


def gputrain_step_times(run_dir: Path, skip_rows: int) -> list[float]:
    """The `step_time_s` of each logged window of a gputrain run, the first `skip_rows` (compile,
    warm-up) dropped."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step_time_s"] for r in rows if "split" not in r and r.get("step_time_s")][skip_rows:]


def median(values: list[float]) -> float:
    return statistics.median(values)


def header(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{device.type} (dry run)"
    return f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}, {time.strftime('%Y-%m-%d')}"


def cpu_and_wall(fn: Callable[[], T]) -> tuple[T, float, float]:
    """`fn()`, the CPU seconds it took (user + system, every thread of this process and the child
    processes it waited for, such as loader workers) and its wall seconds."""
    before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(b, f) - getattr(a, f) for a, b in zip(before, after) for f in ("ru_utime", "ru_stime"))
    return result, cpu, wall
