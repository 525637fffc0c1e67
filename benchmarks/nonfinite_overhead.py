"""Cost of the non-finite check (one grad-norm reduction + one host sync per step) on the digits CNN.

    python benchmarks/nonfinite_overhead.py [--steps 60] [--repeats 5] [--device cpu|cuda]

Times `train_step` with the guard on and off, interleaved, median of repeats, bracketed by device
synchronisation; prints the per-step times and the overhead in percent.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's gputrain, not an installed one

from gputrain.train.nonfinite import Guard, NonFiniteGuard
from gputrain.train.step import train_step
from gputrain.train.trainer import Trainer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    trainer = Trainer.from_config({"train.device": args.device, "log.progress": "none", "log.tensorboard": False},
                                  run_dir="/tmp/gputrain-nonfinite-bench")
    batches = next(trainer.parts.feed.epoch(0))
    guard = NonFiniteGuard("stop", trainer.parts.precision)
    times: dict[str, list[float]] = {"off": [], "on": []}
    parts = {"off": replace(trainer.parts.step, guard=Guard(trainer.parts.precision)), "on": replace(trainer.parts.step, guard=guard)}
    for _ in range(5):  # warm-up
        train_step(parts["on"], batches, measure_grad_norm=False)
    for _ in range(args.repeats):
        for name in ("off", "on"):
            _sync(trainer.parts.place.device)
            start = time.perf_counter()
            for _ in range(args.steps):
                train_step(parts[name], batches, measure_grad_norm=False)
            _sync(trainer.parts.place.device)
            times[name].append((time.perf_counter() - start) / args.steps)
    # the check alone: one fused grad-norm reduction, isfinite, one .item() (the host sync)
    assert trainer.parts.step.compute_loss is not None
    loss = trainer.parts.step.compute_loss(trainer.parts.step.model, batches[0])
    loss.backward()
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    check_times = []
    for _ in range(args.repeats):
        _sync(trainer.parts.place.device)
        start = time.perf_counter()
        for _ in range(args.steps):
            guard.check(loss, torch.nn.utils.get_total_norm(grads))
        check_times.append((time.perf_counter() - start) / args.steps)
    trainer.optimizer.zero_grad(set_to_none=True)
    check = statistics.median(check_times)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"the check alone: {check * 1e3:.3f} ms per step ({check / off * 100:.2f}% of a step)")
    print(f"device {trainer.parts.place.device}, digits CNN, batch {trainer.parts.global_batch}: "
          f"step {off * 1e3:.3f} ms without the check, {on * 1e3:.3f} ms with it "
          f"({(on - off) / off * 100:+.1f}%)")


if __name__ == "__main__":
    main()
