"""The all-reduce benchmark needs several ranks: run inside torchrun, or start torchrun for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from gputrain.bench.comms import bench_allreduce
from gputrain.bench.report import BenchReport, describe_device
from gputrain.bench.result import BenchResult, settings_for
from gputrain.child_python import child_environment
from gputrain.distributed.context import rank_device

__all__ = ["run_allreduce_benchmark", "spawn_allreduce_benchmark"]


def run_allreduce_benchmark(device_type: str, *, quick: bool) -> BenchReport | None:
    """Inside torchrun (WORLD_SIZE > 1): all-reduce bus bandwidth; the report on rank 0 only."""
    use_cuda = device_type == "cuda"
    device = rank_device(int(os.environ.get("LOCAL_RANK", "0"))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(minutes=2))
    try:
        settings = settings_for(device.type, quick)
        result = bench_allreduce(device, settings)
        if dist.get_rank() != 0:
            return None
        report = BenchReport(describe_device(device, settings))
        report.results.extend([result] if result else [])
        return report
    finally:
        dist.destroy_process_group()


def spawn_allreduce_benchmark(
    device_type: str, nproc: int, *, quick: bool, timeout_s: float = 300.0
) -> tuple[BenchResult | None, str | None]:
    """Start `torchrun --standalone --nproc-per-node nproc -m gputrain bench` and return its
    all-reduce figure, or None and a note saying why there is none."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "gputrain",
        "bench",
        "--json",
        "--device",
        device_type,
        *(["--quick"] if quick else []),
    ]
    try:
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=child_environment(dict(os.environ, OMP_NUM_THREADS="1")),  # this gputrain in its ranks
        )
    except subprocess.TimeoutExpired:  # run() has killed torchrun by now
        return None, f"all-reduce benchmark timed out after {timeout_s:g} s"
    if out.returncode != 0:
        tail = out.stderr.strip().splitlines()[-1:] or [f"exit code {out.returncode}"]
        return None, f"all-reduce benchmark failed: {tail[0][:300]}"
    results = json.loads(out.stdout)["results"]
    return (BenchResult(**results[0]), None) if results else (None, "all-reduce benchmark gave no result")
