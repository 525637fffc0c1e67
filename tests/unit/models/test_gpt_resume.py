"""GPT on a token file through the trainer: stopping and resuming gives the same weights bit for bit
(tied embeddings survive the safetensors checkpoint; token windows are fixed per index)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from gputrain import Trainer
from tests.unit.data.files import write_tokens


def _run(run_dir: Path, tokens: Path, max_steps: int) -> dict:
    config = {"model.name": "gpt", "model.preset": "tiny", "data.name": "tokens", "data.path": str(tokens),
              "data.seq_len": 16, "data.num_workers": 0, "data.val_fraction": 0.1, "data.test_fraction": 0.0,
              "train.max_steps": max_steps, "train.epochs": 10, "train.batch_size": 8, "train.device": "cpu",
              "checkpoint.every_steps": 3, "log.every_steps": 1, "log.tensorboard": False, "log.progress": "none",
              "eval.every_epochs": 0, "optim.lr": 3e-3}
    return Trainer.from_config(config, run_dir=run_dir).fit()


def test_stop_and_resume_matches_a_straight_run(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "train.bin", 3000)
    straight = _run(tmp_path / "straight", tokens, 6)
    _run(tmp_path / "resumed", tokens, 3)
    resumed = _run(tmp_path / "resumed", tokens, 6)
    assert resumed["global_step"] == straight["global_step"] == 6
    assert straight["train"]["tokens_per_s"] > 0 and "perplexity" in straight["val"]
    a = load_file(str(tmp_path / "straight" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
