"""What the ranks' C allocator setting (gputrain/distributed/allocator.py, issue 27) costs and saves.

memory: 2 FSDP ranks (gloo, CPU) of a GPT whose blocks are 12 MiB when gathered, SGD, and one
    process as the reference; the peak RSS of the largest process (ru_maxrss of the job's
    processes) and the CPU seconds of the whole job, for glibc as it is (GPUTRAIN_ALLOCATOR=off),
    gputrain's default, and other mmap thresholds given as GLIBC_TUNABLES.
speed: one process (or `--procs 2` DDP ranks) training small models (the default job's CNN, a
    4-block GPT of d_model 128), glibc as it is against a fixed threshold: CPU seconds (user +
    system, which other jobs on a shared machine disturb less than wall time), minor page faults
    and the run's step time.

    python benchmarks/rank_allocator.py memory --modes 2:off,2:auto,1:off,1:131072,2:4194304
    python benchmarks/rank_allocator.py speed --reps 2 --modes off,131072,4194304
    python benchmarks/rank_allocator.py speed --procs 2 --modes auto,131072

A mode is PROCESSES:SETTING (memory) or SETTING (speed); SETTING is off, auto (gputrain's choice)
or a threshold in bytes. Each run is a real `gputrain train` in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["log.progress=none", "log.tensorboard=false", "checkpoint.enabled=false", "train.device=cpu"]
GPT = [
    "data.name=synthetic",
    "data.task=lm",
    "data.seq_len=64",
    "model.name=gpt",
    "train.epochs=1",
    'eval.metrics=["loss"]',
]
MEMORY_JOB = [
    *QUIET,
    *GPT,
    "data.num_samples=512",
    "model.n_layer=4",
    "model.n_head=8",
    "model.d_model=512",
    "data.vocab_size=8192",
    "train.batch_size=8",
    "train.max_steps=12",
    "optim.lr=0.01",
    "parallel.timeout_s=600",
]
SPEED_JOBS = {
    "cnn-digits": [*QUIET, "train.num_threads=1"],
    "gpt-small": [
        *QUIET,
        *GPT,
        "train.num_threads=1",
        "data.num_samples=1024",
        "model.n_layer=4",
        "model.n_head=4",
        "model.d_model=128",
        "data.vocab_size=2048",
        "train.batch_size=16",
        "train.max_steps=40",
    ],
}
# the job's processes are this wrapper's descendants: their peak RSS and CPU time are its children's
WRAP = (
    "import json, resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
    "print(json.dumps([code, u.ru_maxrss >> 10, u.ru_utime + u.ru_stime, u.ru_stime, u.ru_minflt]))"
)


def _env(setting: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GPUTRAIN_ALLOCATOR")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    if setting != "auto":
        env["GPUTRAIN_ALLOCATOR"] = "off"
    if setting not in ("auto", "off"):
        env["GLIBC_TUNABLES"] = f"glibc.malloc.mmap_threshold={int(setting)}:glibc.malloc.trim_threshold=131072"
    return env


def run(args: list[str], setting: str, run_dir: Path) -> dict[str, float]:
    """One `gputrain train` in a fresh process tree: its rusage and its summary's train figures."""
    shutil.rmtree(run_dir, ignore_errors=True)
    out = subprocess.run(
        [sys.executable, "-c", WRAP, sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *args],
        env=_env(setting),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    code, peak_mib, cpu_s, sys_s, faults = json.loads(out.stdout.strip().splitlines()[-1])
    if code != 0:
        raise SystemExit(f"gputrain train failed ({code}):\n{out.stderr[-2000:]}")
    train = json.loads((run_dir / "summary.json").read_text())["train"]
    return {
        "peak_mib": peak_mib,
        "cpu_s": cpu_s,
        "sys_s": sys_s,
        "minor_faults": faults,
        "step_time_s": train["step_time_s"],
        "loss": train["loss"],
    }


def idle_import_mib() -> int:
    """Peak RSS of a process that only imports torch and gputrain's training stack."""
    code = (
        "import json, resource, subprocess, sys; subprocess.run([sys.executable, '-c', "
        "'import torch, gputrain.train.trainer, gputrain.cli.train']); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >> 10)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=_env("off"), capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["memory", "speed"])
    parser.add_argument("--modes", default=None)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--optim", default="sgd", help="the memory job's optimizer (sgd, adamw, ...)")
    parser.add_argument("--procs", type=int, default=1, help="speed: processes of the job (several: DDP ranks)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.what == "memory":
            idle = idle_import_mib()
            print(f"idle import: {idle} MiB")
            for _ in range(args.reps):
                for mode in (args.modes or "1:off,2:off,2:auto").split(","):
                    procs, setting = mode.split(":")
                    launch = (
                        ["--nproc-per-node", procs, "parallel.strategy=fsdp"]
                        if procs != "1"
                        else ["parallel.strategy=none"]
                    )
                    job = [*launch, *MEMORY_JOB, f"optim.name={args.optim}"]
                    row = {"mode": mode, "optim": args.optim, **run(job, setting, Path(tmp) / "run")}
                    row["above_import_mib"] = row["peak_mib"] - idle
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        else:
            for _ in range(args.reps):
                ddp = ["--nproc-per-node", str(args.procs), "parallel.strategy=ddp"] if args.procs > 1 else []
                for job, job_args in SPEED_JOBS.items():
                    for setting in (args.modes or "off,131072").split(","):
                        row = {"job": job, "procs": args.procs, "mode": setting}
                        row.update(run([*ddp, *job_args], setting, Path(tmp) / "run"))
                        rows.append(row)
                        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
