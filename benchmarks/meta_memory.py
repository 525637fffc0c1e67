"""Memory a user feels: a GPT trained on the CPU in one process against 2 FSDP ranks (issue 27 §Proof).

Each figure is a process's peak RSS (VmHWM, read from /proc/self/status as the process exits) above
an idle one, measured the same way: a process that imports the modules the measured one had loaded
(gputrain, torch and what the run used of them: code and import-time tables, a fixed cost) and starts
like it (joining a gloo group of 2 for a rank). The runs are gputrain's own commands, `gputrain train`
and `gputrain train --nproc-per-node 2 parallel.strategy=fsdp`, so the peak covers the whole run: the
constructor's evaluation check, the training steps, the val and test evaluations and the final save
of model.safetensors (the peak as that save began is reported too). Each is run with SGD (momentum
0.9: weights, gradients and one state, so the allocator's share counts most) and AdamW (two states).
The ratio quoted is the largest rank's figure over the one process's, per optimizer; the peak of live
tensor bytes (every storage an op creates, at its current size; FSDP frees gathered parameters by
resizing their storage) is given beside it, for comparison: it cannot see memory the C allocator
keeps after a free. Goal: the largest rank <= 0.65x the one process, for both optimizers.

A sitecustomize.py on the runs' PYTHONPATH (written into a temporary folder) records each process's
peak at exit: the launcher's torchrun workers inherit it with the environment, no gputrain code
changes. The allocator setting that returns freed blocks (glibc's mmap threshold) is gputrain's to
apply to its ranks; where a checkout does not yet, export it by hand to compare:
`GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072`.

    OMP_NUM_THREADS=1 python benchmarks/meta_memory.py                 # small: minutes on 2 cores
    python benchmarks/meta_memory.py --preset gpt2-350m --batch 2 --steps 3   # the figure the issue quotes
    python benchmarks/meta_memory.py --optim sgd --json /tmp/memory.json
    python benchmarks/meta_memory.py --preset gpt2-350m --batch 2 --optim adamw --limit-gib 5.75
    python benchmarks/meta_memory.py --optim adamw --limit-gib 0.7 --limit-kind data   # small: 1 fails, FSDP trains

With --limit-gib G every process runs under a limit of G GiB (set on the launched command, inherited
by the ranks): RLIMIT_AS (`prlimit --as`) by default, RLIMIT_DATA with --limit-kind data (steadier: an
idle rank maps ~850 MiB of address space, most of it reserved and untouched, and can fail to start a
thread under a tight RLIMIT_AS, against ~260 MiB of data). Pick one the one process cannot train
under and the FSDP ranks can; each row then says how its run ended, and no goal is judged.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024**2
GIB = 1024**3
GOAL = 0.65
PEAKS_ENV = "GPUTRAIN_BENCH_PEAKS"
"""The folder each process writes its peak to, as peak-<pid>.json (the hook does nothing without it)."""
LIVE_ENV = "GPUTRAIN_BENCH_LIVE"
"""Set: a process that imports gputrain's trainer also counts live tensor bytes from then on."""

PRESETS: dict[str, list[str]] = {
    # 30M parameters, 95% of them in 16 blocks of 1.8M (12*16*384^2 = 28.3M; the tied table
    # 4,096*384 = 1.6M), which FSDP shards block by block: SGD's weights, gradients and momentum are
    # ~340 MiB, far above the few MiB an idle process's peak varies by, and the parts a rank holds
    # whole for a moment (a gathered block and the next, prefetched; the table) are small beside them
    "small": ["model.n_layer=16", "model.n_head=6", "model.d_model=384", "data.vocab_size=4096"],
    "tiny": ["model.n_layer=2", "model.n_head=4", "model.d_model=256", "data.vocab_size=8192"],
    **{
        name: [f"model.preset={name}", "data.vocab_size=50257"]
        for name in ("gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b")
    },
}
"""--preset: the benchmark's own sizes, or a GPT preset at GPT-2's vocabulary."""

HOOK = f'''
"""Written by benchmarks/meta_memory.py: each Python process records its peak memory as it exits."""
import atexit, json, os, sys

_DIR = os.environ.get("{PEAKS_ENV}")


def _status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _record():
    bench = sys.modules.get("benchmarks.meta_memory")
    live = getattr(bench, "TRACKER", None)
    record = {{
        "before_final_save": getattr(bench, "BEFORE_FINAL_SAVE", None),
        "pid": os.getpid(), "ppid": os.getppid(), "rank": os.environ.get("RANK"), "argv": sys.argv,
        "vm_hwm": _status("VmHWM"), "vm_peak": _status("VmPeak"),
        "live_peak": live.peak if live is not None else None, "modules": sorted(sys.modules),
    }}
    with open(os.path.join(_DIR, f"peak-{{os.getpid()}}.json"), "w") as out:
        json.dump(record, out)


if _DIR:
    atexit.register(_record)
    sys.path.insert(0, {str(ROOT)!r})
    from benchmarks.meta_memory import watch_the_trainer

    watch_the_trainer(bool(os.environ.get("{LIVE_ENV}")))
'''


# --------------------------------------------------------------------------- inside the measured processes
TRACKER: Any = None
"""This process's LiveTensorBytes, once the trainer module is imported (the hook reads its peak)."""
BEFORE_FINAL_SAVE: dict[str, int | None] | None = None
"""The peaks as the final save began (VmHWM, live bytes): the save's own share is the rest."""


def watch_the_trainer(live: bool) -> None:
    """As soon as gputrain.train.trainer is imported (before the model or data exist): mark the peaks
    as the final save begins, and with `live` enter a LiveTensorBytes mode in this thread for the rest
    of the process. Only processes that train import the trainer; the launcher and the idle baseline
    do not."""
    import importlib.abc
    import importlib.util

    target = "gputrain.train.trainer"

    class AfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target_module: Any = None) -> Any:
            if name != target:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            run_module = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run_module(module)
                _mark_before_final_save()
                if live:
                    global TRACKER
                    TRACKER = live_tensor_bytes()
                    TRACKER.__enter__()

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, AfterImport())


def _mark_before_final_save() -> None:
    """Wrap the Checkpointer's final save (where this checkout has it) to note the peaks it starts from."""
    from gputrain.train.checkpointer import Checkpointer

    save = getattr(Checkpointer, "save_final_weights", None)
    if save is None:
        return

    def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
        global BEFORE_FINAL_SAVE
        BEFORE_FINAL_SAVE = {"vm_hwm": _status_bytes("VmHWM"), "live_peak": TRACKER.peak if TRACKER else None}
        return save(self, *args, **kwargs)

    Checkpointer.save_final_weights = marked  # type: ignore[method-assign]


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def live_tensor_bytes() -> Any:
    """A new LiveTensorBytes dispatch mode (also used by tests/dist/meta_jobs.py)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveTensorBytes(TorchDispatchMode):
        """Peak bytes of live tensor storage in this process, sampled after every op: each storage an
        op creates (a DTensor's local shard, not its wrapper), counted at its current size until
        Python drops it."""

        def __init__(self) -> None:
            super().__init__()
            self._refs: dict[int, weakref.ref[Any]] = {}
            self.peak = 0

        def _add(self, t: torch.Tensor) -> None:
            from torch.distributed.tensor import DTensor

            if isinstance(t, DTensor):
                t = t._local_tensor
            if t.device.type == "meta" or type(t) not in (torch.Tensor, torch.nn.Parameter):
                return  # another wrapper subclass (a fake tensor): its storage is not memory
            storage = t.untyped_storage()
            key = id(storage)
            if key not in self._refs:

                def forget(_: Any, key: int = key) -> None:
                    self._refs.pop(key, None)

                self._refs[key] = weakref.ref(storage, forget)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._add(t)
            now = sum(s.nbytes() for ref in list(self._refs.values()) if (s := ref()) is not None)
            self.peak = max(self.peak, now)
            return out

    return LiveTensorBytes()


def idle(modules: list[str]) -> None:
    """The baseline: import the modules a measured process had loaded (gputrain, torch and what the
    run used of them: their code and import-time tables are a fixed cost, not the model's) and start
    like a rank (a gloo process group when torchrun started this process), then exit. The hook
    records its peak."""
    import importlib

    sys.path.insert(0, str(ROOT))
    import torch
    import torch.distributed as dist

    import gputrain.cli.train
    import gputrain.train.trainer  # noqa: F401

    for name in modules:
        if name.split(".")[0] in ("__main__", "__mp_main__", "sitecustomize") or name.startswith("benchmarks"):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module only its own start can import: it is left out
            continue
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        dist.barrier()
        dist.destroy_process_group()
    torch.zeros(1).add_(1)  # torch's CPU kernels loaded, as a rank's first op loads them


# --------------------------------------------------------------------------- the launcher of the runs
def overrides(args: argparse.Namespace, optim: str) -> list[str]:
    """The run: `--steps` optimizer steps at a global batch of `--batch`, then the val and test
    evaluations (the synthetic data's 10% and 20% splits) and the final save."""
    train_samples = args.batch * args.steps
    return [
        "model.name=gpt",
        *PRESETS[args.preset],
        "model.dropout=0.0",
        "data.name=synthetic",
        "data.task=lm",
        f"data.seq_len={args.seq_len}",
        f"data.num_samples={math.ceil(train_samples / 0.7) + 1}",
        f"train.batch_size={args.batch}",
        f"train.max_steps={args.steps}",
        "train.epochs=1",
        "train.device=cpu",
        "train.precision=fp32",
        f"optim.name={optim}",
        "checkpoint.enabled=false",
        "log.progress=none",
        "log.tensorboard=false",
    ]


class Runner:
    """Starts the measured commands with the hook on their path, and reads the peaks they leave."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        (work / "hook").mkdir()
        (work / "hook" / "sitecustomize.py").write_text(HOOK)

    def _env(self, peaks: Path, live: bool) -> dict[str, str]:
        path = [str(self.work / "hook"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(path),
            PEAKS_ENV: str(peaks),
            "OMP_NUM_THREADS": str(self.args.threads),
        }
        env.pop(LIVE_ENV, None)
        if live:
            env[LIVE_ENV] = "1"
        return env

    def _limit(self) -> None:
        """In the launched command before it starts: the address-space limit, which its children inherit."""
        if self.args.limit_gib:
            limit = int(self.args.limit_gib * GIB)
            which = resource.RLIMIT_DATA if self.args.limit_kind == "data" else resource.RLIMIT_AS
            resource.setrlimit(which, (limit, limit))

    def run(
        self, name: str, cmd: list[str], live: bool = False, limited: bool = True
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Run `cmd` (under --limit-gib where `limited`); the peak records of its processes, and how it
        ended (exit code, summary.json)."""
        peaks = self.work / name
        peaks.mkdir()
        began = time.perf_counter()
        done = subprocess.run(
            cmd,
            cwd=ROOT,
            env=self._env(peaks, live),
            preexec_fn=self._limit if limited else None,
            check=False,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=self.args.timeout,
        )
        outcome: dict[str, Any] = {"exit_code": done.returncode, "wall_s": round(time.perf_counter() - began, 1)}
        summary_file = self.work / f"run-{name}" / "summary.json"
        if summary_file.is_file():
            summary = json.loads(summary_file.read_text())
            outcome.update(
                status=summary["status"],
                error=summary.get("error"),
                global_step=summary["global_step"],
                val=summary.get("val"),
                summary_peak_bytes=summary["train"].get("peak_memory_bytes"),
            )
        if done.returncode != 0:
            outcome["output_tail"] = done.stdout[-1500:]
        records = [json.loads(p.read_text()) for p in sorted(peaks.glob("peak-*.json"))]
        return records, outcome

    def idle(self, name: str, ranks: int, modules: list[str]) -> int:
        """The idle baseline's VmHWM: the largest of its processes (`ranks` under torchrun, or one),
        each importing `modules`."""
        listing = self.work / f"modules-{name}.json"
        listing.write_text(json.dumps(modules))
        me = [str(Path(__file__).resolve()), "--idle", str(listing)]
        if ranks == 1:
            cmd = [sys.executable, *me]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *me]
        records, outcome = self.run(f"idle-{name}", cmd, limited=False)  # a baseline, not an outcome
        workers = [r for r in records if r["argv"][1:] == ["--idle", str(listing)]]  # not torchrun's agent
        if outcome["exit_code"] != 0 or len(workers) != ranks:
            raise SystemExit(f"the idle baseline failed: {outcome}")
        return max(r["vm_hwm"] for r in workers)

    def train(self, optim: str, ranks: int) -> dict[str, Any]:
        name = f"{optim}-{ranks}"
        cmd = [sys.executable, "-m", "gputrain", "train", "--run-dir", str(self.work / f"run-{name}")]
        if ranks > 1:
            cmd += ["--nproc-per-node", str(ranks), *overrides(self.args, optim), "parallel.strategy=fsdp"]
        else:
            cmd += [*overrides(self.args, optim), "parallel.strategy=none"]
        records, outcome = self.run(name, cmd, live=self.args.live)
        # the processes that trained: the ranks torchrun started, or the one process (there is no launcher)
        trained = [r for r in records if "train" in r["argv"] and "--nproc-per-node" not in r["argv"]]
        # not their loader workers (a spawned worker gets its parent's argv)
        trained = [r for r in trained if r["ppid"] not in {t["pid"] for t in trained}]
        # its baseline: the same modules imported, by as many processes, started the same way
        modules = sorted({m for r in trained for m in r.pop("modules")})
        idle = self.idle(name, ranks, modules) if trained else None
        for proc in trained:
            proc["idle_vm_hwm"] = idle
            proc["above_idle"] = proc["vm_hwm"] - idle
            before = proc.get("before_final_save")
            proc["above_idle_before_final_save"] = before["vm_hwm"] - idle if before else None
        return {
            "optim": optim,
            "ranks": ranks,
            **outcome,
            "processes": sorted(trained, key=lambda r: int(r["rank"] or 0)),
        }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="meta-memory-") as tmp:
        runner = Runner(args, Path(tmp))
        runs = [runner.train(optim, ranks) for optim in args.optim for ranks in (1, 2)]
    ratios: dict[str, dict[str, float | None]] = {}
    for optim in args.optim:
        one, two = (next(r for r in runs if r["optim"] == optim and r["ranks"] == n) for n in (1, 2))
        ratios[optim] = {
            "rss": _ratio(
                max((p["above_idle"] for p in two["processes"]), default=None),
                one["processes"][0]["above_idle"] if one["processes"] else None,
            ),
            "live": _ratio(
                max((p["live_peak"] or 0 for p in two["processes"]), default=None),
                one["processes"][0]["live_peak"] if one["processes"] else None,
            ),
            # the same, up to the start of the final save (what training alone needs)
            "rss_before_final_save": _ratio(
                _largest(two, "above_idle_before_final_save"), _largest(one, "above_idle_before_final_save")
            ),
        }
    return {
        "preset": args.preset,
        "overrides": overrides(args, "<optim>"),
        "steps": args.steps,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "threads": args.threads,
        "limit_gib": args.limit_gib,
        "limit_kind": args.limit_kind,
        "allocator": {
            "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES"),
            "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
            "GPUTRAIN_ALLOCATOR": os.environ.get("GPUTRAIN_ALLOCATOR"),
        },
        "load_average": os.getloadavg(),
        "runs": runs,
        "ratios": ratios,
        "goal": GOAL,
        "all_completed": all(r.get("status") == "completed" for r in runs),
        "goal_met": all(r.get("status") == "completed" for r in runs)
        and all(r["rss"] is not None and r["rss"] <= GOAL for r in ratios.values()),
    }


def _largest(run: dict[str, Any], key: str) -> int | None:
    values = [p[key] for p in run["processes"] if p.get(key) is not None]
    return max(values) if values else None


def _ratio(part: int | None, whole: int | None) -> float | None:
    return round(part / whole, 3) if part and whole and whole > 0 else None


def report(result: dict[str, Any]) -> None:
    tunables = result["allocator"]["GLIBC_TUNABLES"] or "unset"
    tunables += f", GPUTRAIN_ALLOCATOR {result['allocator'].get('GPUTRAIN_ALLOCATOR') or 'unset (auto)'}"
    kind = "RLIMIT_DATA" if result["limit_kind"] == "data" else "RLIMIT_AS"
    limit = f", {kind} {result['limit_gib']:g} GiB per process" if result["limit_gib"] else ""
    print(
        f"GPT {result['preset']}, {result['steps']} steps, batch {result['batch']} x {result['seq_len']} tokens, "
        f"fp32, CPU, {result['threads']} thread(s) per process{limit}; GLIBC_TUNABLES {tunables}; "
        f"load {' '.join(f'{x:.2f}' for x in result['load_average'])}"
    )
    print(
        f"{'optim':<6} {'run':<14} {'peak RSS':>9} {'idle':>6} {'above idle':>10} {'before save':>11} "
        f"{'live bytes':>10} {'wall s':>7}  outcome"
    )
    for run in result["runs"]:
        outcome = run.get("status") or f"exit {run['exit_code']}"
        if run.get("error"):
            outcome += f" ({run['error'][:120]})"
        for proc in run["processes"] or [{}]:
            name = "1 process" if run["ranks"] == 1 else f"FSDP rank {proc.get('rank', '?')}"
            print(
                f"{run['optim']:<6} {name:<14} {_mib(proc.get('vm_hwm')):>9} {_mib(proc.get('idle_vm_hwm')):>6} "
                f"{_mib(proc.get('above_idle')):>10} {_mib(proc.get('above_idle_before_final_save')):>11} "
                f"{_mib(proc.get('live_peak')):>10} {run['wall_s']:>7}  {outcome} (exit {run['exit_code']})"
            )
    for optim, ratio in result["ratios"].items():
        rss = ratio["rss"]
        if not result["all_completed"]:
            verdict = "  (not judged: a run did not complete)"
        else:
            verdict = "" if rss is None else "  (goal met)" if rss <= result["goal"] else "  (goal NOT met)"
        print(
            f"{optim}: largest FSDP rank / one process: peak RSS above idle {_x(rss)} (before the final save "
            f"{_x(ratio['rss_before_final_save'])}), live tensor bytes {_x(ratio['live'])}; goal <= "
            f"{result['goal']}x{verdict}"
        )


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}x"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:,.0f}M"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--preset", default="small", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4, help="global batch (samples per step)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--optim", nargs="+", default=["sgd", "adamw"], choices=["sgd", "adamw"])
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("OMP_NUM_THREADS", "1")),
        help="intra-op threads per process (default OMP_NUM_THREADS, else 1)",
    )
    parser.add_argument("--limit-gib", type=float, default=None, help="a memory limit per process, GiB")
    parser.add_argument("--limit-kind", choices=["as", "data"], default="as", help="RLIMIT_AS or RLIMIT_DATA")
    parser.add_argument(
        "--no-live",
        dest="live",
        action="store_false",
        help="leave out the live-tensor-bytes count (a dispatch mode around every op)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here too")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per command")
    parser.add_argument("--idle", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.idle:
        idle(json.loads(args.idle.read_text()))
        return
    result = measure(args)
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
