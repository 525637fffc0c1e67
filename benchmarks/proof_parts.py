"""Parts of gpu_proof.py that drive gputrain's own commands: doctor, NCCL, the default job, the GPU
tests and bench. Each `part_<name>(ctx)` returns a JSON-able dict with a one-line "summary" and,
where the issue sets one, "goals" ({goal, value, target, met}); any exception is the part's failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]


@dataclasses.dataclass(frozen=True)
class Context:
    dry_run: bool
    """Tiny sizes on the CPU (gloo, no compile, few steps): the same code, for CI."""
    work: Path
    """Scratch folder shared by the parts (each part's result lands here as <name>.json)."""
    budget_s: float
    """Seconds this part may take before its process group is killed."""

    @property
    def device(self) -> torch.device:
        if self.dry_run:
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise RuntimeError(f"no CUDA device (torch {torch.__version__}): run gpu_proof.py with --dry-run")
        return torch.device("cuda", 0)

    def earlier(self, part: str) -> dict[str, Any] | None:
        """The result of a part that ran before this one, if it succeeded."""
        path = self.work / f"{part}.json"
        record = json.loads(path.read_text()) if path.exists() else {}
        return record.get("result") if record.get("status") == "ok" else None


def goal(name: str, value: float | None, target: float, higher_is_better: bool = True) -> dict[str, Any]:
    met = value is not None and (value >= target if higher_is_better else value <= target)
    return {"goal": name, "value": value, "target": target, "met": met}


def run_capped(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit code, output) of `cmd` in a process group of its own, killed whole at `timeout_s`."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                **(env or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
                            cwd=ROOT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise TimeoutError(f"{' '.join(cmd[2:5])} ran past {timeout_s:.0f} s; its output ended: {out[-600:]}") from None
    return proc.returncode, out


def _cli_json(*args: str) -> tuple[int, dict[str, Any]]:
    """A gputrain command run in this (already forked) process, its JSON output parsed."""
    from gputrain.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(list(args))
    return code, json.loads(buffer.getvalue())


def part_doctor(ctx: Context) -> dict[str, Any]:
    code, report = _cli_json("doctor", "--json")
    facts, checks = report.get("facts", {}), report.get("checks", [])
    failed = [c for c in checks if c.get("status") in ("fail", "error")]
    gpus = [g.get("name") for g in facts.get("gpus", []) or []] or ["no GPU"]
    return {"summary": f"exit {code}; {len(checks)} checks, {len(failed)} failed; {', '.join(map(str, gpus))}",
            "exit_code": code, "doctor": report}


def part_nccl(ctx: Context) -> dict[str, Any]:
    import socket

    import torch.distributed as dist

    device = ctx.device
    backend = "gloo" if ctx.dry_run else "nccl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    start = time.perf_counter()
    dist.init_process_group(backend, rank=0, world_size=1, **({"device_id": device} if device.type == "cuda" else {}))
    try:
        init_s = time.perf_counter() - start
        tensor = torch.full((1 << 20,), 3.0, device=device)
        dist.all_reduce(tensor)  # the first call also builds the communicator
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        reduce_s = time.perf_counter() - start
        assert torch.all(tensor == 3.0), "a one-rank all-reduce changed the values"
        raw = torch.cuda.nccl.version() if backend == "nccl" else None
        version = ".".join(map(str, raw)) if isinstance(raw, tuple) else (str(raw) if raw else None)
    finally:
        dist.destroy_process_group()
    return {"summary": f"{backend} {version or ''} init {init_s:.2f} s, 4 MiB all-reduce {1e3 * reduce_s:.2f} ms",
            "backend": backend, "nccl_version": version, "init_s": init_s, "allreduce_4mib_s": reduce_s}


def part_smoke(ctx: Context) -> dict[str, Any]:
    """scripts/gpu_smoke.py: one line per CUDA-only path (issue 20's faults), each a check of its own."""
    device = "cpu" if ctx.dry_run else "cuda"
    code, out = run_capped([sys.executable, "scripts/gpu_smoke.py", "--device", device],
                           timeout_s=max(5.0, ctx.budget_s - 5))
    print(out)
    checks = {m.group(2): m.group(1) for m in re.finditer(r"^(PASS|FAIL|SKIP)  ([^(:]+?)(?: \(|:)", out, re.M)}
    failed = [name for name, status in checks.items() if status == "FAIL"]
    if code != 0 or not checks:
        raise RuntimeError(f"gpu_smoke exit {code}; failed: {', '.join(failed) or 'see the log'}")
    passed = sum(status == "PASS" for status in checks.values())
    return {"summary": f"{passed} of {len(checks)} checks passed"
            + (f", {len(checks) - passed} skipped (need CUDA)" if passed < len(checks) else ""),
            "checks": checks}


def part_default_job(ctx: Context) -> dict[str, Any]:
    from default_job import run_once

    extra = ["train.epochs=1", "train.max_steps=10"] if ctx.dry_run else []
    wall, accuracy, summary = run_once(extra)
    device = summary["device"]
    goals = [] if ctx.dry_run else [goal("default job test accuracy", accuracy, 0.97)]
    return {"summary": f"{wall:.1f} s whole process on {device} ({summary['precision']}), test accuracy {accuracy:.4f}",
            "wall_s": wall, "test_accuracy": accuracy, "device": device, "precision": summary["precision"],
            "samples_per_s": summary["train"]["samples_per_s"], "goals": goals}


def part_tests_gpu(ctx: Context) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "tests/gpu"]
    with contextlib.suppress(ImportError):
        import xdist  # noqa: F401 - the CLI-driven tests are independent: 4 at a time on one GPU

        cmd += ["-n", "4"] if not ctx.dry_run else []
    code, out = run_capped(cmd, timeout_s=max(5.0, ctx.budget_s - 10))
    print(out)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", last)}
    failed = [line.split(" ", 1)[1].split(" - ")[0] for line in out.splitlines()
              if line.startswith(("FAILED", "ERROR"))]
    if code not in (0, 5):
        raise RuntimeError(f"pytest exit {code}: {last}; failed: {', '.join(failed) or 'see the log'}")
    return {"summary": last.strip("= "), "exit_code": code, "counts": counts, "failed": failed}


def part_bench(ctx: Context) -> dict[str, Any]:
    if ctx.dry_run:
        os.environ["GPUTRAIN_BENCH_TINY"] = "1"  # bench's own test mode: every size tiny
    code, report = _cli_json("bench", "--json", "--no-cache")
    figures = {f"{r['bench']} {r['dtype']}".strip(): r["value"] for r in report.get("results", [])}
    tflops = {k: v / 1e12 for k, v in figures.items() if k.startswith("matmul ")}
    shown = ", ".join(f"{k.split()[1]} {v:.0f}" for k, v in tflops.items())
    return {"summary": f"exit {code}; matmul TFLOP/s: {shown}", "exit_code": code, "bench": report}
