"""The default job, as a user runs it: `gputrain train` with no arguments.

Prints the wall time of the whole command (process start to exit, imports included) and the
test accuracy, for several repeats, and their medians. Issue goal: >= 97% test accuracy and
<= 20 s on a 2-core CPU (target 10 s).

    python benchmarks/default_job.py [--repeats 3] [-- extra overrides]
"""

from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def run_once(extra: list[str]) -> tuple[float, float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        # this checkout's gputrain, whether or not (and wherever) it is installed
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        subprocess.run([sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *extra], check=True,
                       stdout=subprocess.DEVNULL, cwd=tmp, env=env)
        wall = time.perf_counter() - started
        summary = json.loads((run_dir / "summary.json").read_text())
    return wall, summary["test"]["accuracy"], summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="overrides passed to gputrain train")
    args = parser.parse_args()
    walls, accs = [], []
    for i in range(args.repeats):
        wall, acc, summary = run_once(args.extra)
        walls.append(wall)
        accs.append(acc)
        print(f"run {i + 1}: wall {wall:.2f} s (in-run {summary['wall_s']:.2f} s), test accuracy {acc:.4f}, "
              f"{summary['train']['samples_per_s']:,.0f} samples/s on {summary['device']}")
    import torch

    print(f"default job: median wall {statistics.median(walls):.2f} s, median test accuracy "
          f"{statistics.median(accs):.4f} (torch {torch.__version__}, {args.repeats} runs)")


if __name__ == "__main__":
    main()
