"""The input pipeline part of gpu_proof.py: how much host→device copy time the prefetcher hides, and
how many times per step the training loop makes the host wait for the device.

Overlap: N pinned batches (as the DataLoader pins them) are copied to the GPU alone (t_copy), a
compute step sized to 1.5× one copy runs N times alone (t_compute), then both run through gputrain's
prefetcher (t_both), each path warmed up first (cuBLAS's handle and workspace, the kernels' lazy
loading and the caching allocator's blocks are paid once a process, not per step). Hidden share =
(t_copy + t_compute − t_both) / hideable, where hideable = min(t_copy, t_compute)·(N−1)/N: the first
copy has no compute before it, and no more than the shorter of the two can run under the other. 1
when everything that can hide did. The same with pageable host batches (a user's DataLoader without
pin_memory: the prefetcher pins them on the fly) is reported beside it, without a goal.
Issue 28's first run measured 56%: its compute was sized from one unwarmed matmul timing (cuBLAS's
set-up in it), so a step held one matmul, far shorter than the copy (benchmarks/RESULTS.md).

Syncs: a Trainer runs 12 steps (logging every 4th), on in-memory tensors and on a Dataset (the
DataLoader and prefetcher path). On CUDA torch's sync debug mode counts the real syncs; on a CPU
(the dry run) the operations that would sync on a GPU (reading a value, data-dependent shapes)
are counted instead.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from _common import sync
from proof_parts import Context, goal
from torch.utils._python_dispatch import TorchDispatchMode

STEPS, LOG_EVERY = 12, 4


def _time(fn: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def hidden_share(t_copy: float, t_compute: float, t_both: float, batches: int) -> float:
    """The share of the copy time that can hide which did: what running both together saved, over
    min(t_copy, t_compute)·(N−1)/N (the first copy has no compute before it; no more than the shorter
    of the two can run under the other). 0 when nothing overlapped, 1 when all that can hide did."""
    hideable = min(t_copy, t_compute) * (batches - 1) / batches
    return min(1.0, max(0.0, (t_copy + t_compute - t_both) / hideable))


def _median_time(fn: Callable[[], None], repeats: int = 3) -> float:
    return sorted(_time(fn) for _ in range(repeats))[repeats // 2]


def measure_overlap(device: torch.device, batch_bytes: int, batches: int, matmul_n: int,
                    pinned: bool = True, pin_on_the_fly: bool = True) -> dict[str, Any]:
    """The prefetcher's overlap of copies with compute (module docstring); `pinned`: the host batches
    are pinned (the DataLoader's), else pageable, and then pinned by the prefetcher (`pin_on_the_fly`,
    its default) or copied from pageable memory as they are."""
    from gputrain.observe.breakdown import StepTimer
    from gputrain.data.feed import to_device
    from gputrain.data.prefetch import prefetch_to_cuda

    cuda = device.type == "cuda"
    host = [torch.full((batch_bytes // 4,), float(i)) for i in range(batches)]
    host = [t.pin_memory() for t in host] if cuda and pinned else host
    move = (lambda b: to_device(b, device)) if cuda else (lambda b: b.clone())  # a CPU has no copy to hide
    a = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    repeats = 1

    def compute(batch: torch.Tensor) -> torch.Tensor:
        out = a * batch[:1].to(a.dtype)  # depends on the batch, as a real step would
        for _ in range(repeats):
            out = out @ a
        return out

    def copies() -> None:
        for t in host:
            move(t)

    def through_prefetcher() -> None:
        groups = iter([[t] for t in host])
        fed = (prefetch_to_cuda(groups, device, move, StepTimer(device, 0), pin=pin_on_the_fly) if cuda
               else ([move(g[0])] for g in groups))
        for group in fed:
            compute(group[0])

    resident = move(host[0])
    for warm_up in (copies, lambda: [compute(resident) for _ in range(3)], through_prefetcher):
        _time(warm_up)  # once a process: cuBLAS's handle, lazy kernel loading, the allocator's blocks
    one_copy = _median_time(copies) / batches
    one_matmul = _median_time(lambda: [a @ a for _ in range(10)]) / 10
    repeats = max(1, math.ceil(1.5 * one_copy / one_matmul))  # a step longer than its copy, as a real one
    _time(lambda: compute(resident))
    t_copy = _median_time(copies)
    t_compute = _median_time(lambda: [compute(resident) for _ in range(batches)])
    t_both = _median_time(through_prefetcher)
    return {"hidden_share": hidden_share(t_copy, t_compute, t_both, batches),
            "hidden_of_copy": min(1.0, max(0.0, (t_copy + t_compute - t_both) / t_copy)),
            "host_memory": "pinned" if pinned else "pageable",
            "pinned_on_the_fly": not pinned and pin_on_the_fly,
            "t_copy_s": t_copy, "t_compute_s": t_compute, "t_both_s": t_both, "batches": batches,
            "batch_bytes": batch_bytes, "h2d_bytes_per_s": batch_bytes * batches / t_copy,
            "matmuls_per_step": repeats, "one_matmul_s": one_matmul,
            "prefetcher": "CUDA side stream" if cuda else "none on a CPU (copies stand in)"}


class CountSyncingOps(TorchDispatchMode):
    """Operations that make the host wait for a GPU: reading a value, data-dependent shapes."""

    _OPS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
            torch.ops.aten.masked_select.default)

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += func in self._OPS
        return func(*args, **(kwargs or {}))


class _Rows(torch.utils.data.Dataset):
    """Not TensorData: batches come through the DataLoader (and, on CUDA, the prefetcher)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]


def syncs_per_step(device: torch.device, loader: bool, work: Any) -> list[int]:
    """Syncs in each of STEPS steps of a small MLP's training, the guard on (its default)."""
    from gputrain import Trainer
    from gputrain.data.tensors import TensorData

    g = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(1024, 64, generator=g), torch.randint(0, 4, (1024,), generator=g)
    data = _Rows(inputs, targets) if loader else TensorData(inputs, targets)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    config = {"train.device": str(device), "train.max_steps": STEPS, "train.epochs": 100, "train.batch_size": 32,
              "log.every_steps": LOG_EVERY, "log.progress": "none", "log.tensorboard": False,
              "checkpoint.enabled": False, "eval.every_epochs": 0, "data.num_workers": 0}
    trainer = Trainer(model, data, loss_fn=torch.nn.functional.cross_entropy, config=config,
                      run_dir=work / f"syncs-{'loader' if loader else 'tensors'}")
    counts: list[int] = []
    if device.type == "cuda":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                # only the per-call warning: the mode's own warning (a prototype) is not a sync
                trainer.fit(on_step=lambda: counts.append(
                    sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)))
            finally:
                torch.cuda.set_sync_debug_mode(0)
    else:
        with CountSyncingOps() as counter:
            trainer.fit(on_step=lambda: counts.append(counter.count))
    return [b - a for a, b in zip([0, *counts], counts)]


def part_pipeline(ctx: Context) -> dict[str, Any]:
    device = ctx.device
    size = (1 << 20, 6, 128) if ctx.dry_run else (64 << 20, 40, 4096)
    overlap = measure_overlap(device, batch_bytes=size[0], batches=size[1], matmul_n=size[2])
    few = max(2, size[1] // 4)  # pageable copies hold the host: a quarter of the batches keeps the part in its cap
    pageable = measure_overlap(device, batch_bytes=size[0], batches=few, matmul_n=size[2], pinned=False)
    pageable_as_is = measure_overlap(device, batch_bytes=size[0], batches=few, matmul_n=size[2], pinned=False,
                                     pin_on_the_fly=False)
    syncs = {}
    for loader in (False, True):
        per_step = syncs_per_step(device, loader, ctx.work)
        later = list(enumerate(per_step, start=1))[1:]  # step 1 builds, compiles and counts FLOPs
        quiet = [n for step, n in later if step % LOG_EVERY]
        logged = [n for step, n in later if step % LOG_EVERY == 0]
        syncs["dataloader" if loader else "in_memory"] = {
            "per_step": per_step, "non_logging_max": max(quiet), "non_logging_mean": sum(quiet) / len(quiet),
            "logging_mean": sum(logged) / len(logged)}
    worst = max(s["non_logging_max"] for s in syncs.values())
    kind = "syncs" if device.type == "cuda" else "would-sync ops"
    hides = (f"prefetcher hides {100 * overlap['hidden_share']:.1f}% of the hideable host→device time "
             f"({100 * overlap['hidden_of_copy']:.1f}% of all copy time; pageable batches "
             f"{100 * pageable['hidden_share']:.1f}% pinned on the fly, {1000 * pageable['t_both_s']:.0f} ms, "
             f"against {1000 * pageable_as_is['t_both_s']:.0f} ms copied as they are)")
    if device.type != "cuda":
        hides = f"no prefetcher on a CPU (copies stand in: {100 * overlap['hidden_share']:.0f}%)"
    return {"summary": f"{hides} ({overlap['h2d_bytes_per_s'] / 1e9:.1f} GB/s, {overlap['matmuls_per_step']} "
                       f"matmuls a step); {kind} per non-logging step ≤ {worst}",
            "overlap": overlap, "overlap_pageable": pageable, "overlap_pageable_as_is": pageable_as_is,
            "syncs": syncs, "sync_counting": kind,
            "goals": [goal("prefetcher: share of hideable host→device time hidden", overlap["hidden_share"], 0.90),
                      goal(f"{kind} per non-logging step (max)", worst, 0, higher_is_better=False)]}
