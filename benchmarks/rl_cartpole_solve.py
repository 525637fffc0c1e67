"""Time to solve CartPole-v1: `gputrain rl` until the mean return of the last 100 training episodes
reaches 475 (gymnasium's reward threshold), one fresh process per seed, timed from process start to
exit (Python start-up and imports included). A seed that does not get there within the budget, or
within the run's total_timesteps, counts as a failure.

    python benchmarks/rl_cartpole_solve.py [--seeds 10] [--budget 60] [--settings fast|cleanrl] [--device cpu]

Settings "fast" (the default here): examples/rl_cartpole.toml, 64 environments × 16 steps,
2 minibatches × 5 epochs, lr 1e-3, gamma 0.98, GAE lambda 0.8, no entropy bonus (after
rl-baselines3-zoo's CartPole PPO, which updates often on short rollouts). "cleanrl": CleanRL ppo.py's defaults (4 × 128,
lr 2.5e-4, 500k steps), as `gputrain rl` runs with no overrides. "gpu": 1024 environments × 16 steps
for a CUDA device (unmeasured on a GPU in the session that wrote this script).
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

import torch

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "fast": ["--config", str(ROOT / "examples" / "rl_cartpole.toml")],
    "cleanrl": [],
    "gpu": [
        "rl.num_envs=1024",
        "rl.num_steps=16",
        "rl.num_minibatches=4",
        "rl.update_epochs=5",
        "optim.lr=1e-3",
        "rl.gamma=0.98",
        "rl.gae_lambda=0.8",
        "rl.ent_coef=0.0",
        "rl.total_timesteps=5000000",
    ],
}


def solve_once(
    seed: int, settings: list[str], device: str, budget_s: float, run_dir: Path, target: float = 475.0
) -> dict:
    """One `gputrain rl` process until the mean return of the last 100 episodes reaches `target`."""
    command = [
        sys.executable,
        "-m",
        "gputrain",
        "rl",
        "--run-dir",
        str(run_dir),
        *settings,
        f"train.seed={seed}",
        f"train.device={device}",
        f"rl.stop_at_return={target}",
        "log.every_steps=1",
        "log.progress=none",
        "log.tensorboard=false",
        "checkpoint.enabled=false",
    ]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=budget_s + 30, check=False)
    except subprocess.TimeoutExpired:
        return {"seed": seed, "solved": False, "wall_s": None, "why": "over the budget"}
    wall = time.perf_counter() - start
    if not (run_dir / "summary.json").is_file():  # refused before starting (exit 2): say why
        raise SystemExit(f"seed {seed}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    solved = summary["status"] == "stopped_early" and wall <= budget_s
    return {
        "seed": seed,
        "solved": solved,
        "wall_s": wall,
        "inside_s": summary["wall_s"],
        "env_steps": summary["rl"]["env_steps"],
        "return": summary["rl"]["episodic_return"],
        "env_steps_per_s": summary["rl"]["env_steps_per_s"],
        "why": "" if solved else f"{summary['status']} at {summary['rl']['episodic_return']}",
    }


def load_average() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def solve_seeds(
    seeds: int, settings: list[str], device: str, budget_s: float, target: float, verdict: str
) -> tuple[list[dict], list[float]]:
    """`solve_once` for seeds 0..seeds-1, a table row each as it ends (`verdict` heads the column
    that says whether the seed got there); (every seed's result, wall times of those that did)."""
    print(f"| seed | {verdict} | wall (process) | inside the run | env steps | return (last 100) | env steps/s |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            r = solve_once(seed, settings, device, budget_s, Path(tmp) / f"seed{seed}", target)
            results.append(r)
            if r["wall_s"] is None:
                print(f"| {seed} | no ({r['why']}) | > {budget_s:.0f} s | | | | |", flush=True)
                continue
            print(
                f"| {seed} | {'yes' if r['solved'] else 'no (' + r['why'] + ')'} | {r['wall_s']:.1f} s | "
                f"{r['inside_s']:.1f} s | {r['env_steps']:,} | {r['return']:.1f} | {r['env_steps_per_s']:,.0f} |",
                flush=True,
            )
    return results, [r["wall_s"] for r in results if r["solved"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of wall time a seed may take")
    parser.add_argument("--settings", choices=sorted(SETTINGS), default="fast")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {load_average():.1f} at start, "
        f"device {args.device}, settings {args.settings}: {' '.join(SETTINGS[args.settings]) or '(defaults)'}"
    )
    results, walls = solve_seeds(args.seeds, SETTINGS[args.settings], args.device, args.budget, 475.0, "solved")
    print(
        f"\nsolved {len(walls)}/{len(results)} within {args.budget:.0f} s; "
        + (f"median {statistics.median(walls):.1f} s, max {max(walls):.1f} s" if walls else "none solved")
        + f"; load average {load_average():.1f} at the end"
    )


if __name__ == "__main__":
    main()
