"""Memory of a GPT preset trained on the CPU in one process and under FSDP on 2 ranks (issue 14).

The model is built on the meta device and each rank materialises only its shard (models/meta.py),
so no rank ever holds the whole model; weights, gradients and AdamW's two states are split over the
ranks. Each run trains a few steps at a small batch and reports, per rank, the peak of live tensor
bytes (every storage an op creates, at its current size: FSDP frees the gathered parameters by
resizing their storage in place) during training, and again including the final save (writing
model.safetensors gathers the whole model on rank 0), the peak RSS and the peak address space
(VmPeak) of the process. Goal: each FSDP rank's training peak of live tensor bytes <= 0.6x the
one-process peak.

With --limit-gib G each process runs under an address-space limit (RLIMIT_AS) of G GiB: pick one the
one-process run cannot train under and the FSDP ranks can (the --limit-gib run prints both outcomes).

    python benchmarks/meta_memory.py --preset gpt2-350m --steps 3
    python benchmarks/meta_memory.py --preset gpt2-350m --steps 2 --limit-gib 9
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of live tensor storage in this process, sampled after every op: each storage an op
    creates (a DTensor's local shard, not its wrapper) and those given to `track`, counted at its
    current size until Python drops it."""

    def __init__(self) -> None:
        super().__init__()
        self._refs: dict[int, weakref.ref[Any]] = {}
        self.peak = 0

    def track(self, tensors: Any) -> None:
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._add(t)

    def _add(self, t: torch.Tensor) -> None:
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            t = t._local_tensor
        if t.device.type == "meta" or type(t) not in (torch.Tensor, torch.nn.Parameter):
            return  # another wrapper subclass: its storage is not memory
        storage = t.untyped_storage()
        key = id(storage)
        if key not in self._refs:
            self._refs[key] = weakref.ref(storage, lambda _, key=key: self._refs.pop(key, None))

    def current(self) -> int:
        return sum(s.nbytes() for ref in list(self._refs.values()) if (s := ref()) is not None)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        self.peak = max(self.peak, self.current())
        return out


def overrides(preset: str, steps: int, batch: int, seq_len: int, strategy: str) -> list[str]:
    return [
        "model.name=gpt",
        f"model.preset={preset}",
        "model.dropout=0.0",
        "data.name=synthetic",
        "data.task=lm",
        f"data.seq_len={seq_len}",
        "data.vocab_size=50257",
        f"data.num_samples={batch * steps * 2}",
        f"train.batch_size={batch}",
        f"train.max_steps={steps}",
        "train.epochs=1",
        "train.device=cpu",
        "train.precision=fp32",
        "optim.name=adamw",
        "eval.every_epochs=0",
        "checkpoint.enabled=false",
        "log.progress=none",
        "log.tensorboard=false",
        f"parallel.strategy={strategy}",
    ]


def child(args: argparse.Namespace) -> None:
    """One process (or one rank) of a run: train, then write its figures to --out."""
    if args.limit_gib:
        limit = int(args.limit_gib * GIB)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    rank = int(os.environ.get("RANK", "0"))
    record: dict[str, Any] = {"rank": rank, "strategy": args.strategy}
    tracker = LiveTensorBytes()
    start = time.perf_counter()
    try:
        sys.path.insert(0, str(ROOT))
        from gputrain.train.trainer import Trainer

        with tracker:
            trainer = Trainer.from_config(
                None,
                run_dir=Path(args.out) / f"run-{args.strategy}",
                overrides=overrides(args.preset, args.steps, args.batch, args.seq_len, args.strategy),
                evaluate=False,
            )
            record["params_on_rank"] = sum(
                (p.to_local() if hasattr(p, "to_local") else p).numel() for p in trainer.model.parameters()
            )
            save = trainer.parts.checkpointer.save_final_weights

            def mark_then_save(path: Path) -> None:
                # writing model.safetensors (each rank its own shards, in place): a figure of its own
                record["peak_train_bytes"] = tracker.peak
                save(path)

            trainer.parts.checkpointer.save_final_weights = mark_then_save  # type: ignore[method-assign]
            summary = trainer.fit()
        record.update(status=summary["status"], steps=summary["global_step"], loss=summary["train"]["loss"])
    except MemoryError as err:
        record.update(status="out of memory", error=str(err)[:200])
    except Exception as err:  # noqa: BLE001 - the outcome is the figure: an allocation refused under the limit
        record.update(status="failed", error=f"{type(err).__name__}: {str(err)[:300]}")
    status = Path("/proc/self/status").read_text() if Path("/proc/self/status").exists() else ""
    vm_peak = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmPeak")), 0)
    record.update(
        peak_live_bytes=tracker.peak,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        peak_address_space_bytes=vm_peak,
        wall_s=round(time.perf_counter() - start, 1),
    )
    Path(args.out, f"{args.strategy}-rank{rank}.json").write_text(json.dumps(record))


def run(strategy: str, args: argparse.Namespace, out: str) -> list[dict[str, Any]]:
    me = [
        str(Path(__file__).resolve()),
        "--child",
        f"--strategy={strategy}",
        f"--out={out}",
        f"--preset={args.preset}",
        f"--steps={args.steps}",
        f"--batch={args.batch}",
        f"--seq-len={args.seq_len}",
        f"--limit-gib={args.limit_gib or 0}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if strategy == "none":
        cmd = [sys.executable, *me]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-port=29533", *me]
    subprocess.run(cmd, env=env, cwd=ROOT, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return [json.loads(p.read_text()) for p in sorted(Path(out).glob(f"{strategy}-rank*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-350m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2, help="global batch (samples per step)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--limit-gib", type=float, default=None, help="RLIMIT_AS per process, GiB")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as out:
        rows = run("none", args, out) + run("fsdp", args, out)
    single = next((r for r in rows if r["strategy"] == "none"), None)
    limit = f", RLIMIT_AS {args.limit_gib:g} GiB per process" if args.limit_gib else ""
    print(f"{args.preset}, {args.steps} steps, batch {args.batch} x {args.seq_len} tokens, fp32 AdamW, CPU{limit}")
    print(
        f"{'run':<14} {'params held':>12} {'peak live, training':>20} {'x 1-proc':>9} {'with final save':>16} "
        f"{'peak RSS':>9} {'VmPeak':>8} {'wall s':>7}  outcome"
    )
    base = single.get("peak_train_bytes") if single else None
    for r in rows:
        name = "1 process" if r["strategy"] == "none" else f"FSDP rank {r['rank']}"
        train = r.get("peak_train_bytes")
        ratio = f"{train / base:.2f}" if train and base else ""
        outcome = r["status"] + (f" ({r['error']})" if r.get("error") else "")
        print(
            f"{name:<14} {r.get('params_on_rank', 0) / 1e6:>11.1f}M {_gib(train):>20} {ratio:>9} "
            f"{_gib(r['peak_live_bytes']):>16} {_gib(r['peak_rss_bytes']):>9} {_gib(r['peak_address_space_bytes']):>8} "
            f"{r['wall_s']:>7}  {outcome}"
        )


def _gib(value: int | None) -> str:
    return "-" if not value else f"{value / GIB:.2f}G"


if __name__ == "__main__":
    main()
