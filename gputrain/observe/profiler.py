"""Profile a short training run: torch.profiler over a wait/warm-up/active schedule, a Chrome
trace and (on CUDA) a memory snapshot in the run directory, the top ops, and the facts the
advisor judges.

The profiler works on what a loop offers it (a `ProfileTarget`: a way to run the training with a
callback after each optimizer step, and the facts of the run's layout), not on any loop's insides:
one profiler step is one optimizer step. The caller asks for every step's time split
(`log.breakdown_every=1`, as `gputrain profile` does).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gputrain.observe.advisor import SHORT_KERNEL_US, Finding, RunFacts, advise
from gputrain.observe.own_sync import OWN_SYNC
from gputrain.run.layout import memory_snapshot_name, profile_name, trace_name

WAIT_STEPS, WARMUP_STEPS = 1, 1
_MATMUL_KERNEL_HINTS = ("gemm", "xmma", "cutlass", "conv", "wgrad", "dgrad", "matmul", "cublas")
# a host-device sync on CUDA is one of these runtime calls; on CPU nothing syncs, so the places that
# would (reading a tensor's value) are counted instead
_SYNC_EVENTS = {"cuda": ("cudaStreamSynchronize", "cudaDeviceSynchronize"), "cpu": ("aten::_local_scalar_dense",)}
# syncs that are not the user's: the loop's own (own_sync.py), and optimizers reading their CPU
# step counters
_NOT_THE_USERS = (OWN_SYNC, "Optimizer.step#")


@dataclass(frozen=True, slots=True)
class ProfileTarget:
    """What the profiler needs from the run it profiles."""

    fit: Callable[[Callable[[], None]], dict[str, Any]]
    """Runs the training, calling its argument after each optimizer step; returns the summary."""
    total_steps: int
    run_dir: Path
    rank: int | None
    """This rank in a multi-rank job (its files get a -rank<N> suffix); None for one process."""
    device: torch.device
    precision: str
    model: nn.Module
    batch_size: int
    grad_accum: int
    strategy: str
    compiled: bool
    loader_workers: int
    pin_memory: bool
    loader_applies: bool
    """The data comes through a DataLoader (in-memory tensors do not: worker advice does not apply)."""
    fp8: dict[str, Any] | None = None
    """precision=fp8: the plan of which layers went to float8 (fp8.py's Fp8Plan.to_dict)."""


@dataclass(slots=True)
class ProfileReport:
    facts: RunFacts
    findings: list[Finding]
    top_device_ops: list[dict[str, Any]] = field(default_factory=list)
    top_host_ops: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "facts": self.facts.to_dict(),
            "findings": [vars_of(f) for f in self.findings],
            "top_device_ops": self.top_device_ops,
            "top_host_ops": self.top_host_ops,
            "files": self.files,
        }


def vars_of(finding: Finding) -> dict[str, str]:
    return {"bottleneck": finding.bottleneck, "evidence": finding.evidence, "change": finding.change}


def _top_ops(prof: Any, key: str, limit: int) -> list[dict[str, Any]]:
    rows = []
    for avg in prof.key_averages():
        device_us = getattr(avg, "self_device_time_total", 0) or 0
        rows.append(
            {"name": avg.key, "calls": avg.count, "self_host_us": avg.self_cpu_time_total, "self_device_us": device_us}
        )
    rows = [r for r in rows if r[key] > 0 and not r["name"].startswith("ProfilerStep")]
    return sorted(rows, key=lambda r: r[key], reverse=True)[:limit]


def _syncs(events: Any, device_type: str) -> tuple[int, int]:
    """(the user's syncs, gputrain's own): a sync inside an `OWN_SYNC` range is ours, one inside an
    optimizer's step is neither (a CPU kernel reading its CPU step counter). Containment is judged
    by time on the same thread, not by the event tree: the profiler's step ranges (stepped from
    inside the optimizer's range) overlap the optimizer's without nesting, which leaves the tree's
    parents wrong there."""
    names = _SYNC_EVENTS.get(device_type, _SYNC_EVENTS["cpu"])
    ranges = [
        (e.thread, e.time_range.start, e.time_range.end, e.name) for e in events if e.name.startswith(_NOT_THE_USERS)
    ]
    user = own = 0
    for e in events:
        if e.name in names:
            inside = [name for t, start, end, name in ranges if t == e.thread and start <= e.time_range.start <= end]
            if not inside:
                user += 1
            elif any(name == OWN_SYNC for name in inside):
                own += 1
    return user, own


def _device_kernels(events: Any) -> list[tuple[str, float]]:
    """(name, duration µs) of every device activity in the active window (kernels, copies)."""
    from torch.autograd import DeviceType

    return [(e.name, float(e.time_range.end - e.time_range.start)) for e in events if e.device_type == DeviceType.CUDA]


def _model_layout(model: nn.Module) -> tuple[bool, bool]:
    """(is a conv net, its conv weights are channels_last)."""
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    if not convs:
        return False, False
    weight = convs[0].weight
    channels_last = weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    return True, channels_last


def collect_facts(target: ProfileTarget, prof: Any, active_steps: int, summary: dict[str, Any]) -> RunFacts:
    """What the profiled run measured, as data for the advisor."""
    events = prof.events()
    step_events = [e for e in events if e.name.startswith("ProfilerStep#")]
    window_us = sum(e.time_range.end - e.time_range.start for e in step_events) or None
    steps = len(step_events) or active_steps
    conv_net, channels_last = _model_layout(target.model)
    breakdown = summary["train"].get("time_breakdown") or {}
    user_syncs, own_syncs = _syncs(events, target.device.type)
    facts = RunFacts(
        device_type=target.device.type,
        precision=target.precision,
        batch_size=target.batch_size,
        step_time_s=(window_us / 1e6 / steps) if window_us else (summary["train"]["step_time_s"] or 0.0),
        data_fraction=breakdown.get("data"),
        num_workers=target.loader_workers,
        pin_memory=target.pin_memory,
        loader_workers_apply=target.loader_applies,
        compiled=target.compiled,
        conv_net=conv_net,
        channels_last=channels_last,
        syncs_per_step=user_syncs / steps,
        own_syncs_per_step=own_syncs / steps,
        comm_fraction=breakdown.get("comm"),
        strategy=target.strategy,
        grad_accum=target.grad_accum,
        fp8=target.fp8,
    )
    if target.device.type == "cuda":
        kernels = _device_kernels(events)
        compute = [(n, d) for n, d in kernels if not n.startswith(("Memcpy", "Memset"))]
        busy = sum(d for _, d in kernels)
        facts.kernels_per_step = len(compute) / steps
        facts.short_kernels_per_step = sum(1 for _, d in compute if d < SHORT_KERNEL_US) / steps
        facts.device_utilisation = min(1.0, busy / window_us) if window_us else None
        facts.tensor_cores = torch.cuda.get_device_capability(target.device) >= (7, 0)
        if target.precision == "fp32" and busy > 0:
            matmul = sum(d for n, d in compute if any(h in n.lower() for h in _MATMUL_KERNEL_HINTS))
            facts.fp32_matmul_share = matmul / busy
    return facts


@contextlib.contextmanager
def _memory_history(device: torch.device, path: Path, files: list[str]) -> Iterator[None]:
    """Record CUDA allocations while training; dump a snapshot (open it at pytorch.org/memory_viz)."""
    if device.type != "cuda":
        yield
        return
    # Python stacks only: C++ stacks on every allocation would slow the very steps being timed
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    try:
        yield
    finally:
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
        files.append(str(path))


def profile_run(target: ProfileTarget, top: int = 10) -> ProfileReport:
    """Run the training under torch.profiler and judge what it measured.

    The run should be short (`train.max_steps`); the first WAIT_STEPS steps are skipped and the
    next WARMUP_STEPS warm the profiler up, the rest are recorded. In a multi-rank job every rank
    profiles itself: its files get a `-rank<N>` suffix.
    """
    from torch.profiler import ProfilerActivity, profile, schedule

    active = max(1, target.total_steps - WAIT_STEPS - WARMUP_STEPS)
    run_dir = target.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    cuda = target.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with (
        profile(
            activities=activities, schedule=schedule(wait=WAIT_STEPS, warmup=WARMUP_STEPS, active=active, repeat=1)
        ) as prof,
        _memory_history(target.device, run_dir / memory_snapshot_name(target.rank), files),
    ):
        summary = target.fit(prof.step)
    trace = run_dir / trace_name(target.rank)
    prof.export_chrome_trace(str(trace))
    files.insert(0, str(trace))
    facts = collect_facts(target, prof, active, summary)
    report = ProfileReport(
        facts=facts,
        findings=advise(facts),
        files=files,
        summary=summary,
        top_device_ops=_top_ops(prof, "self_device_us", top) if cuda else [],
        top_host_ops=_top_ops(prof, "self_host_us", top),
    )
    facts_file = run_dir / profile_name(target.rank)
    facts_file.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    report.files.append(str(facts_file))
    return report
