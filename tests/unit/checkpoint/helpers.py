"""What the checkpoint tests share: a payload that runs code when unpickled, the attacker's
re-sealing of a tampered checkpoint, and a small model with a stepped optimizer."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn


class Payload:
    """Unpickling this runs `touch <sentinel>`: what a malicious checkpoint would carry."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.sentinel}",)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reseal(ckpt: Path) -> None:
    """Rewrite manifest and marker to match the files, as an attacker who controls them would."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        manifest["files"][name] = {"sha256": sha256_of(ckpt / name), "bytes": (ckpt / name).stat().st_size}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    (ckpt / "COMMITTED").write_text(f"{manifest['step']} {sha256_of(ckpt / 'manifest.json')}\n")


def model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def read_and_apply(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                   by_name: bool = False) -> dict:
    """`read_checkpoint` with its loading done at once; the training state."""
    from gputrain.checkpoint import read_checkpoint

    state, apply = read_checkpoint(path, model, optimizer, by_name=by_name)
    apply()
    return state
