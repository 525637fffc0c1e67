"""One minute on one GPU: each CUDA-only path that the CPU tests can only reason about, run for real.

Prints one line per check (PASS, FAIL or SKIP, and what it saw), then the device and torch version.
Exits 1 if any check failed, 0 when all passed or when there is no CUDA device (nothing to check).

    python scripts/gpu_smoke.py [--only NAME ...]
    python scripts/gpu_smoke.py --device cpu   # the checks whose code runs on a CPU (the test suite's
                                               # run of this script, so it cannot rot between GPU runs)
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Check = Callable[[torch.device], str]
CHECKS: dict[str, Check] = {}
CUDA_ONLY: set[str] = set()  # checks whose every line needs a CUDA device: skipped under --device cpu
QUIET = {"log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False}


def check(name: str, cuda_only: bool = False) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[name] = fn
        if cuda_only:
            CUDA_ONLY.add(name)
        return fn
    return register


def _mlp(width: int = 64, classes: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, classes))


def _data(n: int = 512, classes: int = 4, seed: int = 0):  # type: ignore[no-untyped-def]
    """Learnable rows: the class is the largest of the first `classes` features, so a few steps
    lower the loss and a check may ask for learning."""
    from gputrain.data.tensors import TensorData

    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n, 32, generator=g)
    return TensorData(inputs, inputs[:, :classes].argmax(dim=1))


@check("bf16 guard")
def bf16_guard(device: torch.device) -> str:
    from gputrain import Trainer
    from gputrain.precision import Precision
    from gputrain.train.nonfinite import NonFiniteGuard

    precision = Precision("bf16", device)
    grads = [torch.randn(300, 7, device=device, dtype=torch.bfloat16) for _ in range(3)]
    loss = torch.tensor(1.5, device=device, dtype=torch.bfloat16)
    assert NonFiniteGuard("skip", precision).check_gradients(loss, grads).kind == "apply"
    grads[1][5, 2] = float("nan")
    before = [g.clone() for g in grads]
    assert NonFiniteGuard("skip", precision).check_gradients(loss, grads).kind == "nonfinite"
    assert all(torch.equal(a.nan_to_num(), b.nan_to_num()) for a, b in zip(before, grads))
    mixed = [torch.randn(10, device=device), torch.randn(5, device=device, dtype=torch.bfloat16)]
    mixed[1][0] = float("inf")
    assert NonFiniteGuard("skip", precision).check_gradients(torch.tensor(1.0, device=device), mixed).kind == "nonfinite"
    data = _data()
    from gputrain.data.tensors import TensorData

    cast = TensorData(data.inputs.bfloat16(), data.targets)
    with tempfile.TemporaryDirectory() as run_dir:  # a model cast to bf16: every gradient and the loss bf16
        summary = Trainer(_mlp().to(torch.bfloat16), cast, loss_fn=F.cross_entropy,
                          config={**QUIET, "train.device": str(device), "train.precision": "fp32",
                                  "train.max_steps": 6, "train.batch_size": 64}, run_dir=run_dir).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 6, summary["status"]
    return "uniform and mixed bf16 gradients checked, NaN/Inf found, gradients unchanged; a bf16 model trained 6 steps"


@check("fsdp2 + fused optimizers on nccl")
def fsdp_sgd(device: torch.device) -> str:
    """FSDP2 on a one-rank NCCL mesh (gloo on a CPU) with each optimizer gputrain builds: a fused
    kernel DTensor has no sharding rule for (SGD, Adagrad) must not be chosen."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gputrain.bench.timing import synchronize
    from gputrain.config.schema import OptimConfig
    from gputrain.distributed.context import process_group_backend
    from gputrain.optim import build_optimizer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # the backend training picks for this device (nccl; gloo on a CPU), bound to the GPU as training binds it
    backend = process_group_backend(device, cpu_collectives=False)
    dist.init_process_group(backend, rank=0, world_size=1, device_id=device if device.type == "cuda" else None)
    try:
        seen = []
        for name in ("sgd", "adagrad", "adam", "adamw"):
            model = _mlp().to(device)
            fully_shard(model, mesh=init_device_mesh(device.type, (1,)))
            optimizer = build_optimizer(model.parameters(), OptimConfig(name=name), 64, device)  # type: ignore[arg-type]
            model(torch.randn(8, 32, device=device)).square().sum().backward()
            optimizer.step()
            kernel = "fused" if optimizer.defaults.get("fused") else "foreach" if optimizer.defaults.get("foreach") \
                else "default"
            seen.append(f"{name} {kernel}")
        synchronize(device)  # a fused kernel's failure surfaces here, inside the check
    finally:
        dist.destroy_process_group()
    return "stepped on sharded parameters: " + ", ".join(seen)


@check("pinned batches", cuda_only=True)
def pinned(device: torch.device) -> str:
    from gputrain.data.batches import BatchPlan
    from gputrain.data.feed import BatchFeed

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 256

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return torch.full((32,), float(i)), i % 4

    plan = BatchPlan(num_samples=256, global_batch=64, grad_accum=1)
    feed = BatchFeed(Rows(), plan, device, num_workers=2)
    first = next(iter(feed.loader))  # type: ignore[arg-type]
    assert all(t.is_pinned() for t in first.batch), "DataLoader batches are not pinned"
    host = _data().batch(torch.arange(64), pin=True)
    assert all(t.is_pinned() for t in host), "gathered in-memory batches are not pinned"
    moved = [group[0] for group in feed.epoch(0)]
    want = torch.stack([torch.full((32,), float(i)) for i in plan.epoch_order(0)[:64].tolist()])
    assert torch.equal(moved[0][0].cpu(), want), "the prefetched batch differs from the host batch"
    return "DataLoader (GuardedBatch) and gathered in-memory batches are pinned; prefetched batches match"


def _sync_warnings(steps: Callable[[], None]) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            steps()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # only the per-call warning counts: set_sync_debug_mode itself warns that the mode is a prototype
    # "that does not yet detect all synchronizing operations"
    return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)


@check("host syncs in 3 steps of in-memory data", cuda_only=True)
def no_syncs(device: torch.device) -> str:
    from gputrain import Trainer
    from gputrain.train.step import train_step

    counts = {}
    for guard in ("off", "stop"):
        with tempfile.TemporaryDirectory() as run_dir:
            trainer = Trainer(_mlp(), _data(), config={**QUIET, "train.device": str(device), "train.batch_size": 32,
                                                       "train.on_nonfinite": guard}, run_dir=run_dir)
            epoch = trainer.parts.feed.epoch(0)
            train_step(trainer.parts.step, next(epoch), measure_grad_norm=False)  # warm-up: allocations, lazy init
            torch.cuda.synchronize(device)

            def three() -> None:
                for _ in range(3):
                    train_step(trainer.parts.step, next(epoch), measure_grad_norm=False)

            counts[guard] = _sync_warnings(three)
    assert counts["off"] == 0, f"{counts['off']} syncs in 3 steps with the guard off (the data path syncs)"
    return (f"guard off: {counts['off']} syncs in 3 steps; guard on: {counts['stop']} "
            "(a device guard reads its flags on logging steps only)")


@check("rng restore from more devices", cuda_only=True)
def rng(device: torch.device) -> str:
    from gputrain.train.state import capture_rng, restore_rng

    saved = capture_rng(device)
    first = torch.randn(4, device=device)
    restore_rng(saved, device)
    assert torch.equal(first, torch.randn(4, device=device)), "the restored CUDA generator draws differently"
    older = {**saved, "cuda": [saved["cuda"]] * 8}  # a checkpoint of a process that saw 8 GPUs
    restore_rng(older, device)
    assert torch.equal(first, torch.randn(4, device=device))
    return f"this device's generator restored exactly; an 8-GPU state list resumes on {torch.cuda.device_count()}"


@check("peak lookup", cuda_only=True)
def peak(device: torch.device) -> str:
    from gputrain.env.peaks import match_gpu_model
    from gputrain.observe.peak import resolve_peak

    name = torch.cuda.get_device_name(device)
    value, source = resolve_peak(device, "bf16")
    assert match_gpu_model(name) is not None, f"no row in env/peaks.py for {name!r}"
    assert value is not None, f"no bf16 peak for {name!r}"
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return f"{name} ({sms} SMs): bf16 {value / 1e12:.1f} TFLOP/s from {source}"


@check("prefetch under slow compute", cuda_only=True)
def prefetch(device: torch.device) -> str:
    from gputrain.observe.breakdown import StepTimer
    from gputrain.data.feed import to_device
    from gputrain.data.prefetch import prefetch_to_cuda

    host = [[(torch.full((256, 1024), float(i)).pin_memory(), torch.tensor([i]).pin_memory())] for i in range(40)]
    sums = []
    for group in prefetch_to_cuda(iter(host), device, lambda b: to_device(b, device), StepTimer(device, 0)):
        torch.cuda._sleep(20_000_000)  # ~10 ms of compute, while the next copy is in flight
        sums.append(group[0][0].sum() + group[0][1].sum())
    got = torch.stack(sums).cpu().tolist()
    want = [256 * 1024 * i + i for i in range(40)]
    assert got == want, f"batches corrupted or out of order: first difference at {next(i for i in range(40) if got[i] != want[i])}"
    return "40 batches copied on the side stream under slow compute arrived whole and in order"


@check("cuda_graphs with grad_accum=2")
def cuda_graphs(device: torch.device) -> str:
    """Graph replays with accumulation (gradients in buffers of their own, not the graph pool) and an
    evaluation after them (outputs held across replays), against the same run in eager mode. On a
    CPU the flag is ignored and both runs are eager: the check's own code still runs."""
    import json

    from gputrain import Trainer

    losses, val = {}, {}
    for graphs in (False, True):
        with tempfile.TemporaryDirectory() as run_dir:
            config = {**QUIET, "train.device": str(device), "train.precision": "fp32", "train.batch_size": 64,
                      "train.grad_accum": 2, "train.max_steps": 12, "train.epochs": 2, "train.cuda_graphs": graphs,
                      "log.every_steps": 1, "train.on_nonfinite": "off", "optim.lr": 3e-3}
            summary = Trainer(_mlp(), _data(), val_data=_data(128, seed=1), config=config, run_dir=run_dir).fit()
            rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
            losses[graphs] = [r["loss"] for r in rows if "split" not in r and "loss" in r]
            val[graphs] = summary["val"]["loss"]
    eager, replayed = losses[False], losses[True]
    assert len(eager) == len(replayed) == 12, f"expected 12 logged steps, got {len(eager)} eager, {len(replayed)} graphs"
    assert eager[-1] < eager[0], f"no learning in the eager run: {eager}"
    worst = max(abs(a - b) / abs(a) for a, b in zip(eager, replayed))
    assert worst < 1e-3, f"CUDA-graph losses differ from eager by up to {worst:.2e}"
    val_gap = abs(val[True] - val[False]) / abs(val[False])
    assert val_gap < 1e-3, f"validation after graph replays differs from eager: {val[True]} vs {val[False]}"
    graphed = "graphs" if device.type == "cuda" else "the flag (ignored on a CPU)"
    return f"12 steps with {graphed}: losses equal eager within {worst:.1e}, validation within {val_gap:.1e}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CHECKS), help="run these checks only")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: run the checks whose code runs on a CPU, skip the rest (default cuda)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_smoke: skipped — no CUDA device (torch {torch.__version__})")
        return 0
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    ran = failed = 0
    for name, fn in CHECKS.items():
        if args.only and name not in args.only:
            continue
        if device.type != "cuda" and name in CUDA_ONLY:
            print(f"SKIP  {name}: needs a CUDA device", flush=True)
            continue
        start = time.perf_counter()
        ran += 1
        try:
            detail = fn(device)
            status = "PASS"
        except Exception as err:  # noqa: BLE001 - every failure is reported, then the next check runs
            failed += 1
            status, detail = "FAIL", f"{type(err).__name__}: {err}"
            traceback.print_exc(file=sys.stderr)
        print(f"{status}  {name} ({time.perf_counter() - start:.1f} s): {detail}", flush=True)
    where = (f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}" if device.type == "cuda"
             else "CPU")
    print(f"{where}, torch {torch.__version__}: {ran - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
