"""Environment steps per second: gputrain's tensor environments against gymnasium's SyncVectorEnv
with the same number of environments, random actions, one process, side by side.

    python benchmarks/rl_env_speed.py [--envs CartPole-v1 ...] [--counts 1 4 16 ...] [--device cpu|cuda]

Both step every environment once per call and reset ended episodes automatically (gymnasium's
vector default resets on the next call, gputrain's in the same call; the work is the same). Actions
are drawn before timing. gputrain's figure is the median of 3 timed windows after a warm-up, each
bracketed by device syncs; on CUDA it also runs 4096 to 262144 environments, where gymnasium has no
counterpart (its figure at 4096 on the CPU is printed for reference).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputrain.rl.envs import make_env

ENVS = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1"]
WINDOW_S = 0.4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(step, n: int, sync) -> float:
    """Median environment steps per second of 3 windows of ~WINDOW_S, after a warm-up."""
    for i in range(10):
        step(i)
    sync()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < WINDOW_S / 4:
        step(calls)
        calls += 1
    sync()
    per_window = max(3, int(calls * WINDOW_S / (time.perf_counter() - start)))
    rates = []
    for _ in range(3):
        sync()
        start = time.perf_counter()
        for i in range(per_window):
            step(i)
        sync()
        rates.append(per_window * n / (time.perf_counter() - start))
    return statistics.median(rates)


def gputrain_steps_per_s(name: str, n: int, device: torch.device, dtype: torch.dtype) -> float:
    env = make_env(name, n, device, dtype)
    space = env.action_space
    g = torch.Generator(device=device).manual_seed(0)
    if space.kind == "discrete":
        actions = torch.randint(0, space.n, (64, n), device=device, generator=g)
    else:
        actions = (torch.rand(64, n, space.size, device=device, generator=g) * 2 - 1) * space.high
    return _rate(lambda i: env.step(actions[i % 64]), n, lambda: _sync(device))


def gymnasium_steps_per_s(name: str, n: int) -> float:
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make(name) for _ in range(n)])
    envs.reset(seed=0)
    pool = [envs.action_space.sample() for _ in range(16)]
    rate = _rate(lambda i: envs.step(pool[i % 16]), n, lambda: None)
    envs.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="*", default=ENVS)
    parser.add_argument("--counts", nargs="*", type=int, default=[1, 4, 16, 64, 256, 1024, 4096])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU (gputrain rl uses 1)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    np.random.seed(0)
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} intra-op thread(s)")
    print(
        "| environment | envs | gymnasium SyncVectorEnv (CPU) | gputrain float64 | gputrain float32 | ratio (float64) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.envs:
        for n in args.counts:
            reference = gymnasium_steps_per_s(name, n)
            wide = gputrain_steps_per_s(name, n, device, torch.float64)
            narrow = gputrain_steps_per_s(name, n, device, torch.float32)
            print(
                f"| {name} | {n} | {reference:,.0f} | {wide:,.0f} | {narrow:,.0f} | {wide / reference:.2f}x |",
                flush=True,
            )
        if device.type == "cuda":
            for n in (16384, 65536, 262144):
                wide = gputrain_steps_per_s(name, n, device, torch.float64)
                narrow = gputrain_steps_per_s(name, n, device, torch.float32)
                print(f"| {name} | {n} | - | {wide:,.0f} | {narrow:,.0f} | - |", flush=True)


if __name__ == "__main__":
    main()
