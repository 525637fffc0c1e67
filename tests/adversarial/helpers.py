"""What the run-directory groups share (test_run_dirs.py, test_run_continuation.py, test_signals.py):
a small quiet Trainer on fixed data, and a directory's fingerprint and summary."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gputrain import Trainer
from gputrain.data.tensors import TensorData

QUIET = {
    "train.device": "cpu",
    "log.progress": "none",
    "log.tensorboard": False,
    "train.epochs": 2,
    "train.batch_size": 16,
    "log.every_steps": 1,
}


def linear_data(n: int = 64) -> TensorData:
    """`n` samples of 6 features and 3 classes, the same every call."""
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def linear_trainer(run_dir: Path, **config: Any) -> Trainer:
    """A linear classifier on `linear_data`, QUIET with `config` on top, built; with a held-out split
    where the config stops early on it."""
    torch.manual_seed(0)
    val = linear_data(16) if "eval.early_stop_metric" in config else None
    return Trainer(
        nn.Linear(6, 3),
        linear_data(),
        val_data=val,
        loss_fn=F.cross_entropy,
        config={**QUIET, **config},
        run_dir=run_dir,
    ).setup()  # built at once: these cases are about what the build refuses


def fingerprint(run_dir: Path) -> dict[str, str]:
    """Every file of the directory and its content hash."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())
