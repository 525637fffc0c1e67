"""The input pipeline part of gpu_proof.py: how much host→device copy time the prefetcher hides, and
how many times per step the training loop makes the host wait for the device.

Overlap: N pinned batches are copied to the GPU alone (t_copy), a compute step sized to about 1.5×
one copy runs N times alone (t_compute), then both run through gputrain's prefetcher (t_both).
Hidden share = (t_copy + t_compute − t_both) / t_copy: 1 when every copy ran under compute (the
first copy can never hide, so at most (N−1)/N), 0 when none did.

Syncs: a Trainer runs 12 steps (logging every 4th), on in-memory tensors and on a Dataset (the
DataLoader and prefetcher path). On CUDA torch's sync debug mode counts the real syncs; on a CPU
(the dry run) the operations that would sync on a GPU (reading a value, data-dependent shapes)
are counted instead.
"""

from __future__ import annotations

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


def measure_overlap(device: torch.device, batch_bytes: int, batches: int, matmul_n: int) -> dict[str, Any]:
    from gputrain.observe.breakdown import StepTimer
    from gputrain.data.feed import to_device
    from gputrain.data.prefetch import prefetch_to_cuda

    cuda = device.type == "cuda"
    host = [torch.full((batch_bytes // 4,), float(i)) for i in range(batches)]
    host = [t.pin_memory() for t in host] if cuda else host
    move = (lambda b: to_device(b, device)) if cuda else (lambda b: b.clone())  # a CPU has no copy to hide
    a = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    one_copy = _time(lambda: [move(t) for t in host]) / batches
    one_matmul = _time(lambda: [a @ a for _ in range(10)]) / 10
    repeats = max(1, round(1.5 * one_copy / one_matmul))

    def compute(batch: torch.Tensor) -> torch.Tensor:
        out = a * batch[:1].to(a.dtype)  # depends on the batch, as a real step would
        for _ in range(repeats):
            out = out @ a
        return out

    t_copy = _time(lambda: [move(t) for t in host])
    resident = move(host[0])
    t_compute = _time(lambda: [compute(resident) for _ in range(batches)])
    groups = iter([[t] for t in host])
    fed = prefetch_to_cuda(groups, device, move, StepTimer(device, 0)) if cuda else ([move(g[0])] for g in groups)
    t_both = _time(lambda: [compute(group[0]) for group in fed])
    hidden = min(1.0, max(0.0, (t_copy + t_compute - t_both) / t_copy))
    return {"hidden_share": hidden, "best_possible": (batches - 1) / batches, "t_copy_s": t_copy,
            "t_compute_s": t_compute, "t_both_s": t_both, "batches": batches, "batch_bytes": batch_bytes,
            "h2d_bytes_per_s": batch_bytes * batches / t_copy, "matmuls_per_step": repeats,
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
                trainer.fit(on_step=lambda: counts.append(sum("synchroniz" in str(w.message) for w in caught)))
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
    hides = f"prefetcher hides {100 * overlap['hidden_share']:.1f}% of host→device time"
    if device.type != "cuda":
        hides = f"no prefetcher on a CPU (copies stand in: {100 * overlap['hidden_share']:.0f}%)"
    return {"summary": f"{hides} ({overlap['h2d_bytes_per_s'] / 1e9:.1f} GB/s); {kind} per non-logging step ≤ {worst}",
            "overlap": overlap, "syncs": syncs, "sync_counting": kind,
            "goals": [goal("prefetcher: share of host→device time hidden", overlap["hidden_share"], 0.90),
                      goal(f"{kind} per non-logging step (max)", worst, 0, higher_is_better=False)]}
