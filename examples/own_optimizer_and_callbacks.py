"""Train a model of your own through `gputrain.Trainer` with your own optimizer, LR schedule and
callbacks: an AdamW with parameter groups (no weight decay on biases and norms, a faster head), a
OneCycleLR, an EMA of the weights, a stop on a validation threshold and a callback of your own.

    python examples/own_optimizer_and_callbacks.py                 # runs/own-optimizer-example/
    python examples/own_optimizer_and_callbacks.py --run-dir runs/mine --steps 300

Run it again with the same --run-dir and it continues the run (or says it is complete). The data is
made here (two interleaved spirals), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from gputrain import EMA, Callback, StopOnMetric, Trainer
from gputrain.optim import weight_decay_groups


def spirals(n: int, seed: int) -> TensorDataset:
    """`n` points on two interleaved spirals, labelled by spiral: a task a linear model cannot do."""
    g = torch.Generator().manual_seed(seed)
    label = torch.randint(0, 2, (n,), generator=g)
    t = torch.rand(n, generator=g) * 3 * math.pi
    angle = t + label * math.pi
    points = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], dim=1) / (3 * math.pi)
    return TensorDataset(points + 0.02 * torch.randn(n, 2, generator=g), label)


class Net(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(2, width), nn.LayerNorm(width), nn.GELU(), nn.Linear(width, width), nn.GELU()
        )
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def adamw(params: Any) -> torch.optim.Optimizer:
    """Called with the parameters as the step trains them (after FSDP, TP or compile replaced them),
    each with your name for it: the head learns 3x faster; biases and norms get no weight decay."""
    head = [p for name, p in params.named() if name.startswith("head.")]
    body = [p for name, p in params.named() if not name.startswith("head.")]
    groups = [*weight_decay_groups(body, 0.05), {"params": head, "lr": 3e-2, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-2)


class LearningRates(Callback):
    """A callback of your own: the LR of each parameter group on every logged step. It reads host
    values only (the optimizer's settings, the logged row), so it never makes the host wait."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, list[float]]] = []

    def on_step_end(self, trainer: Any, step: int, metrics: dict[str, Any] | None) -> None:
        if metrics is not None:  # a logging step: the row gputrain wrote to metrics.jsonl
            self.seen.append((step, [group["lr"] for group in trainer.optimizer.param_groups]))

    def on_fit_end(self, trainer: Any, summary: dict[str, Any] | None) -> None:
        if self.seen and summary is not None:
            step, lrs = self.seen[-1]
            print(f"last logged step {step}: learning rates " + ", ".join(f"{lr:.2e}" for lr in lrs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default="runs/own-optimizer-example")
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()

    torch.manual_seed(0)
    trainer = Trainer(
        Net(),
        spirals(2048, seed=0),
        val_data=spirals(512, seed=1),
        test_data=spirals(512, seed=2),
        loss_fn=F.cross_entropy,
        optimizer=adamw,
        scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=[group["lr"] for group in opt.param_groups], total_steps=args.steps
        ),
        callbacks=[EMA(decay=0.99), StopOnMetric("val_accuracy", mode="max", threshold=0.995), LearningRates()],
        config={
            "train.batch_size": 64,
            "train.max_steps": args.steps,
            "train.epochs": 1000,
            "eval.every_steps": 100,  # validation on a step cadence (nanoGPT's eval_interval) ...
            "eval.every_epochs": 0,  # ... instead of after every pass over the data
            "log.every_steps": 50,
            "log.progress": "plain",
            "log.tensorboard": False,
        },
        run_dir=args.run_dir,
    )
    summary = trainer.fit()
    val, test = summary.get("val") or {}, summary.get("test") or {}
    print(
        f"{summary['status']} at step {summary['global_step']}: test accuracy {test.get('accuracy', float('nan')):.4f} "
        f"(EMA weights {test.get('ema/accuracy', float('nan')):.4f}), val accuracy {val.get('accuracy', float('nan')):.4f}"
    )
    print(f"weights: {trainer.run_dir / 'model.safetensors'}, their EMA: {trainer.run_dir / 'model-ema.safetensors'}")


if __name__ == "__main__":
    main()
