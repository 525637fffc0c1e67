"""Each model family trains on each data source it applies to: a few real steps, and the loss falls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gputrain import Trainer
from tests.unit.data.files import write_image_folder, write_mnist, write_text, write_tokens


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo-data")
    write_mnist(root / "mnist", n_train=256, n_test=32)
    write_image_folder(root / "images", classes=3, per_class=24)
    write_text(root / "tiny.txt", n_chars=8000)
    write_tokens(root / "tokens.bin", 12000)
    rng = np.random.default_rng(0)
    features = rng.normal(size=(300, 6))
    labels = (features[:, 0] + features[:, 1] > 0).astype(int)
    rows = ["a,b,c,d,e,f,label"] + [",".join(f"{v:.4f}" for v in row) + f",{y}" for row, y in zip(features, labels)]
    (root / "table.csv").write_text("\n".join(rows) + "\n")
    return root


def _sources(root: Path) -> dict[str, dict[str, Any]]:
    return {
        "digits": {"data.name": "digits"},
        "mnist": {"data.name": "mnist", "data.path": str(root / "mnist")},
        "image_folder": {"data.name": "image_folder", "data.path": str(root / "images"), "data.image_size": 16},
        "csv": {"data.name": "csv", "data.path": str(root / "table.csv")},
        "synthetic": {"data.name": "synthetic", "data.shape": [3, 8, 8], "data.num_samples": 320,
                      "data.num_classes": 2},
        "text": {"data.name": "text", "data.path": str(root / "tiny.txt"), "data.seq_len": 32},
        "tokens": {"data.name": "tokens", "data.path": str(root / "tokens.bin"), "data.seq_len": 32},
        "synthetic_lm": {"data.name": "synthetic", "data.task": "lm", "data.seq_len": 32, "data.vocab_size": 64,
                         "data.num_samples": 256},
    }


def train_losses(run_dir: Path, overrides: dict[str, Any]) -> list[float]:
    """Train for a few logged steps through the real trainer; return the per-step training losses."""
    config = {"train.max_steps": STEPS, "train.epochs": 50, "train.batch_size": 16, "train.device": "cpu",
              "data.val_fraction": 0.05, "data.test_fraction": 0.05,
              "log.every_steps": 1, "log.tensorboard": False, "log.progress": "none",
              "checkpoint.enabled": False, "eval.every_epochs": 0, "data.num_workers": 0, **overrides}
    summary = Trainer.from_config(config, run_dir=run_dir).fit()
    assert summary["status"] == "completed"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "split" not in r]


STEPS = 30
MATRIX = [
    ("mlp", "digits"), ("mlp", "mnist"), ("mlp", "image_folder"), ("mlp", "csv"), ("mlp", "synthetic"),
    ("cnn", "digits"), ("cnn", "mnist"), ("cnn", "image_folder"), ("cnn", "synthetic"),
    ("resnet18", "digits"), ("resnet18", "mnist"), ("resnet18", "image_folder"), ("resnet18", "synthetic"),
    ("resnet34", "digits"), ("resnet50", "digits"),
    ("gpt", "text"), ("gpt", "tokens"), ("gpt", "synthetic_lm"),
]


@pytest.mark.parametrize(("model", "source"), MATRIX, ids=[f"{m}-{s}" for m, s in MATRIX])
def test_loss_falls(model: str, source: str, data_dir: Path, tmp_path: Path) -> None:
    overrides = {"model.name": model, "optim.lr": 3e-3, **_sources(data_dir)[source]}
    if model == "gpt":
        overrides["model.preset"] = "tiny"
    if model.startswith("resnet"):
        overrides["model.base_width"] = 8  # the published layout at 1/8 of the width: seconds on a CPU
    if model == "resnet50":
        overrides["optim.lr"] = 1e-2  # 50 layers at 1/8 width need a larger step to move within 30 steps
    if model == "cnn":
        overrides["model.dropout"] = 0.0
    losses = train_losses(tmp_path / "run", overrides)
    assert len(losses) == STEPS
    first, last = np.mean(losses[:3]), np.mean(losses[-5:])
    assert last < 0.85 * first, f"{model} on {source}: loss {first:.4f} -> {last:.4f}"
