"""The default job, as a user runs it: `gputrain train` with no arguments.

Prints the wall time of the whole command (process start to exit, imports included) and the
test accuracy, for several repeats, and their medians; the latency of a config error (a mistyped
key, and a missing data file: both must answer before torch is imported); and, with --phases,
where one run's time goes (imports, data, build, first step, steps, evaluation, checkpoints).
Issue goals: config error < 1 s; default job <= 6 s on an idle 2-core machine, test accuracy >= 97%.

    python benchmarks/default_job.py [--repeats 3] [--phases] [-- extra overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG_ERRORS = {
    "mistyped key (model.nme=x)": ["model.nme=x"],
    "missing data file (data.name=csv data.path=nope.csv)": ["data.name=csv", "data.path=nope.csv"],
}


def _env() -> dict[str, str]:
    """This checkout's gputrain, whether or not (and wherever) it is installed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def run_once(extra: list[str]) -> tuple[float, float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *extra], check=True,
                       stdout=subprocess.DEVNULL, cwd=tmp, env=_env())
        wall = time.perf_counter() - started
        summary = json.loads((run_dir / "summary.json").read_text())
    return wall, summary["test"]["accuracy"], summary


def config_error_latency(args: list[str]) -> tuple[float, int, bool]:
    """(seconds, exit code, whether torch was imported) of `gputrain train ARGS`."""
    probe = ("import sys\nfrom gputrain.cli import main\ncode = main(sys.argv[1:])\n"
             "sys.stderr.write('TORCH=%s\\n' % ('torch' in sys.modules))\nraise SystemExit(code)\n")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", probe, "train", *args], capture_output=True, text=True,
                                cwd=tmp, env=_env())
        wall = time.perf_counter() - started
    return wall, result.returncode, "TORCH=True" in result.stderr


# ---------------------------------------------------------------- --phases: one run, timed inside
_PHASES = """
import atexit, sys, time
T0, C0 = time.perf_counter(), time.process_time()
marks, sums = [], {}
def mark(name):
    marks.append((name, time.perf_counter() - T0, time.process_time() - C0))
def timed(owner, attr, name):
    fn = getattr(owner, attr)
    def wrapper(*a, **k):
        t, c = time.perf_counter(), time.process_time()
        try:
            return fn(*a, **k)
        finally:
            s = sums.setdefault(name, [0.0, 0.0, 0])
            s[0] += time.perf_counter() - t; s[1] += time.process_time() - c; s[2] += 1
            if s[2] == 1:
                mark(name + " (first) done")
    setattr(owner, attr, wrapper)
def report():
    mark("exit")
    print("PHASES " + __import__("json").dumps({"marks": marks, "sums": sums}), file=sys.stderr)
atexit.register(report)
import gputrain.cli, gputrain.cli.train as cli_train
mark("python + gputrain.cli")
run = cli_train.run
def traced_run(args):
    mark("config loaded and checked")
    import torch; mark("torch imported")
    import gputrain.train.trainer as T, gputrain.train.build as B, gputrain.data as D
    mark("gputrain's training modules imported")
    timed(D, "build_data", "data load")
    timed(T, "build_training", "build (device, threads, layout, parts)")
    timed(T.Trainer, "_start", "run files + tensorboard + console")
    timed(T, "train_step", "training steps")
    timed(T.Trainer, "_evaluate", "evaluation")
    timed(T.Trainer, "_save", "checkpoints")
    code = run(args); mark("run returned"); return code
cli_train.run = traced_run
gputrain.cli.entry()  # as `gputrain` and `python -m gputrain` end: exit handlers, then os._exit
"""


def phases(extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", _PHASES, "train", "--run-dir", str(Path(tmp) / "run"), *extra],
                                capture_output=True, text=True, cwd=tmp, env=_env(), check=True)
        wall = time.perf_counter() - started
    data = json.loads(next(line for line in result.stderr.splitlines() if line.startswith("PHASES "))[7:])
    print(f"phases of one run (whole process {wall:.2f} s, start and exit included; wall / CPU seconds since "
          "the interpreter started):")
    for name, t, c in data["marks"]:
        print(f"  {t:7.2f} s  cpu {c:6.2f} s  {name}")
    print("  totals:")
    for name, (t, c, n) in data["sums"].items():
        print(f"  {t:7.2f} s  cpu {c:6.2f} s  {name} ({n}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--phases", action="store_true", help="also time the phases of one more run")
    parser.add_argument("extra", nargs="*", help="overrides passed to gputrain train")
    args = parser.parse_args()
    print(f"load average at start {os.getloadavg()[0]:.2f} ({len(os.sched_getaffinity(0))} cores)")
    for what, error_args in CONFIG_ERRORS.items():
        latencies = [config_error_latency(error_args) for _ in range(args.repeats)]
        print(f"config error, {what}: median {statistics.median(w for w, _, _ in latencies):.2f} s "
              f"(exit codes {sorted({c for _, c, _ in latencies})}, torch imported: "
              f"{any(t for _, _, t in latencies)})")
    walls, accs = [], []
    for i in range(args.repeats):
        wall, acc, summary = run_once(args.extra)
        walls.append(wall)
        accs.append(acc)
        rate = summary["train"]["samples_per_s"]
        print(f"run {i + 1}: wall {wall:.2f} s (in-run {summary['wall_s']:.2f} s), test accuracy {acc:.4f}, "
              f"{rate:,.0f} samples/s on {summary['device']}, load {os.getloadavg()[0]:.2f}", flush=True)
    if args.phases:
        phases(args.extra)
    import torch

    print(f"default job: median wall {statistics.median(walls):.2f} s, median test accuracy "
          f"{statistics.median(accs):.4f} (torch {torch.__version__}, {args.repeats} runs); "
          f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
