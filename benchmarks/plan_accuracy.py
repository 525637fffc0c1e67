"""The planner's error on CPU: `gputrain plan`'s bytes per device (one step on fake tensors, composed
per layout) against the peak the CPU allocator itself reports in real runs of the Trainer.

Measured: `benchmarks.peak_memory.measure_training` builds the Trainer as `gputrain train` does and
trains 3 steps under torch.profiler's memory events, with c10's memory accounting on for every thread
(so gloo's threads count too), each run in a fresh process; the peak over steps 2-3 (optimizer state
exists) less what was allocated once the data was built. One process for strategy none; 2 gloo ranks
under torchrun for ddp, fsdp, tp and pp (each rank measures itself; the row's measured figure is the
largest over the ranks and over `--repeats` runs: gloo's temporaries on its own threads are seen at the
peak or not depending on timing, allocator.py). The planned figure is
the plan's row for that strategy, world size and micro-batch (the most any device needs).

    python benchmarks/plan_accuracy.py            # prints the table (markdown), ~6 minutes on 2 cores
    python benchmarks/plan_accuracy.py --quick    # mlp and tiny gpt; ddp and fsdp once: ~40 s
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FP32 = ["train.device=cpu", "train.precision=fp32", "optim.name=adamw"]
GPT_TINY = ["model.name=gpt", "model.preset=tiny", "data.name=synthetic", "data.task=lm"]
GPT_SMALL = [  # weights and optimizer states outweigh the activations: what sharding divides
    "model.name=gpt", "model.n_layer=4", "model.n_head=4", "model.d_model=256", "data.name=synthetic",
    "data.task=lm", "data.vocab_size=4096", "data.seq_len=64", "data.num_samples=256",
]
MLP_WIDE = ["model.name=mlp", "model.hidden_sizes=[1024,1024]"]  # one layer is most of the model
OFFLOAD = "parallel.cpu_offload=true"

# (name, overrides, micro-batches per device)
SINGLE: list[tuple[str, list[str], tuple[int, ...]]] = [
    ("mlp", ["model.name=mlp"], (64, 512)),
    ("cnn", ["model.name=cnn"], (32, 128)),
    ("resnet18 (32×32 synthetic)", ["model.name=resnet18", "data.name=synthetic", "data.shape=[3,32,32]"], (8, 32)),
    ("gpt (tiny)", GPT_TINY, (2, 8)),
    (
        "gpt (gpt2-124m, seq 128)",
        ["model.name=gpt", "model.preset=gpt2-124m", "data.name=synthetic", "data.task=lm", "data.seq_len=128",
         "data.vocab_size=50257", "data.num_samples=64"],
        (2, 8),
    ),
]
# (name, overrides, strategy, global batch, extra overrides): 2 ranks
MULTI: list[tuple[str, list[str], str, int, list[str]]] = [
    ("gpt (tiny)", GPT_TINY, "ddp", 16, []),
    ("gpt (tiny)", GPT_TINY, "fsdp", 16, []),
    ("gpt (tiny)", GPT_TINY, "tp", 16, ["parallel.tp=2"]),
    ("gpt (tiny)", GPT_TINY, "pp", 16, ["parallel.pp=2", "train.grad_accum=2"]),
    ("gpt (4×256, vocab 4096, seq 64)", GPT_SMALL, "ddp", 4, []),
    ("gpt (4×256, vocab 4096, seq 64)", GPT_SMALL, "fsdp", 4, []),
    ("gpt (4×256, vocab 4096, seq 64)", GPT_SMALL, "fsdp", 8, ["train.grad_accum=2"]),
    ("gpt (4×256, vocab 4096, seq 64)", GPT_SMALL, "tp", 4, ["parallel.tp=2"]),
    ("gpt (4×256, vocab 4096, seq 64)", GPT_SMALL, "pp", 4, ["parallel.pp=2", "train.grad_accum=2"]),
    ("mlp (1024, 1024)", MLP_WIDE, "ddp", 64, []),
    ("mlp (1024, 1024)", MLP_WIDE, "fsdp", 64, []),
    ("mlp (1024, 1024)", MLP_WIDE, "pp", 64, ["parallel.pp=2", "train.grad_accum=2"]),
    # FSDP2's CPUOffloadPolicy: on a CPU job the host's memory is the device's (the row counts both)
    ("gpt (tiny)", GPT_TINY, "fsdp", 16, [OFFLOAD]),
    ("mlp (1024, 1024)", MLP_WIDE, "fsdp", 64, [OFFLOAD]),
    ("mlp (1024, 1024), SGD momentum 0.9", MLP_WIDE, "fsdp", 64, [OFFLOAD, "optim.name=sgd", "optim.momentum=0.9"]),
]
# (name, overrides, global batch): one process, micro-batches accumulated
SINGLE_ACCUM: list[tuple[str, list[str], int]] = [
    ("gpt (4×256, vocab 4096, seq 64)", [*GPT_SMALL, "train.grad_accum=2"], 4),
]
QUICK_SINGLE = {"mlp", "gpt (tiny)"}
QUICK_MULTI = {("gpt (tiny)", "ddp"), ("gpt (tiny)", "fsdp")}


def planned(overrides: list[str], world: int, strategy: str) -> tuple[int, int]:
    """(the plan's bytes per device for `strategy` on `world` ranks, its micro-batch per device)."""
    from gputrain.cli.plan import build_plan_target
    from gputrain.config import load_config
    from gputrain.plan.planner import layout_row

    config = load_config(None, overrides)
    target, micro, _ = build_plan_target(config, world)
    row, measured = layout_row(target, micro, world, strategy, "none", OFFLOAD in overrides, 1 << 50)
    assert measured, "the model did not run on fake tensors"
    return row.layout.total, micro


def measured_here(overrides: list[str]) -> int:
    """The peak of one process: a fresh one (the allocator's count is only right where nothing was
    profiled before, allocator.py)."""
    from benchmarks.peak_memory import measure_training_fresh

    with tempfile.TemporaryDirectory() as tmp:
        return measure_training_fresh(overrides, str(Path(tmp) / "run")).peak


def measured_on_ranks(overrides: list[str], world: int = 2) -> list[int]:
    """Each rank's peak, from `world` gloo ranks under torchrun (this script as the worker)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peaks"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
            __file__, "--worker", str(out), "--run-dir", str(Path(tmp) / "run"), "--", *overrides,
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return [json.loads((out.parent / f"peaks.{r}.json").read_text())["peak"] for r in range(world)]


def worker(out: str, run_dir: str, overrides: list[str]) -> None:
    from benchmarks.peak_memory import measure_training

    result = measure_training(overrides, run_dir)
    rank = int(os.environ.get("RANK", "0"))
    Path(f"{out}.{rank}.json").write_text(json.dumps({"peak": result.peak, "resident": result.resident}))


def row(name: str, micro: int, strategy: str, plan: int, measured: int, note: str = "") -> str:
    err = 100 * (plan - measured) / measured
    mib = 2**20
    return f"| {name} | {micro} | {strategy} | {plan / mib:.2f} | {measured / mib:.2f} | {err:+.1f} |{note}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="mlp and tiny gpt; ddp and fsdp only, run once")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each 2-rank row (default 3)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.run_dir, args.overrides)
        return
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores; fp32, AdamW; peak over steps 2-3")
    print("| model | micro-batch / device | strategy | planned MiB | measured MiB (allocator) | error % |")
    print("| --- | --- | --- | --- | --- | --- |")
    worst = 0.0
    for name, overrides, micros in SINGLE:
        if args.quick and name not in QUICK_SINGLE:
            continue
        for micro in micros:
            config = [*overrides, *FP32, "parallel.strategy=none", f"train.batch_size={micro}"]
            start = time.perf_counter()
            plan, _ = planned(config, 1, "none")
            measured = measured_here(config)
            worst = max(worst, abs(plan - measured) / measured)
            note = f"  <!-- {time.perf_counter() - start:.0f} s -->"
            print(row(name, micro, "none", plan, measured, note), flush=True)
    for name, overrides, batch in [] if args.quick else SINGLE_ACCUM:
        config = [*overrides, *FP32, "parallel.strategy=none", f"train.batch_size={batch}"]
        start = time.perf_counter()
        plan, micro = planned(config, 1, "none")
        measured = measured_here(config)
        worst = max(worst, abs(plan - measured) / measured)
        note = f"  <!-- {time.perf_counter() - start:.0f} s -->"
        print(row(name, micro, "none (grad_accum 2)", plan, measured, note), flush=True)
    for name, overrides, strategy, batch, extra in MULTI:
        if args.quick and (name, strategy) not in QUICK_MULTI:
            continue
        config = [*overrides, *FP32, f"parallel.strategy={strategy}", f"train.batch_size={batch}", *extra]
        start = time.perf_counter()
        plan, micro = planned(config, 2, strategy)
        runs = [measured_on_ranks(config) for _ in range(1 if args.quick else args.repeats)]
        measured = max(max(peaks) for peaks in runs)
        worst = max(worst, abs(plan - measured) / measured)
        label = strategy + (" (grad_accum 2)" if "train.grad_accum=2" in extra and strategy != "pp" else "")
        label += " + CPU offload" if OFFLOAD in extra else ""
        ranks = "; ".join(" / ".join(f"{p / 2**20:.2f}" for p in peaks) for peaks in runs)
        note = f"  <!-- rank 0 / rank 1 MiB, each run: {ranks}; {time.perf_counter() - start:.0f} s -->"
        print(row(name, micro, f"{label}, 2 ranks", plan, measured, note), flush=True)
    print(f"\nlargest error: {100 * worst:.1f}%")


if __name__ == "__main__":
    main()
