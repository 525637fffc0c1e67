"""A sample that cannot be read mid-run is named; data.on_error=fail stops, skip drops and counts it
(issue 7, figure 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from gputrain.errors import RunError
from gputrain.train.trainer import Trainer

BAD = {5, 22, 41}


class FlakyImages(Dataset):
    """64 'images' read from files; some files are corrupt (OSError naming the file), one index has a
    decoding bug that knows no file (ValueError)."""

    def __init__(self, root: Path) -> None:
        self.files = [root / f"img{i:03d}.png" for i in range(64)]
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 6, generator=g)
        self.y = torch.randint(0, 2, (64,), generator=g)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == 22:
            raise ValueError("cannot decode pixel data")
        if i in BAD:
            raise OSError(f"cannot identify image file {str(self.files[i])!r}")
        return self.x[i], self.y[i]


def _trainer(tmp_path: Path, on_error: str, workers: int, epochs: int = 2) -> Trainer:
    torch.manual_seed(0)
    config = {"train.epochs": epochs, "train.batch_size": 16, "train.device": "cpu", "data.on_error": on_error,
              "data.num_workers": workers, "log.progress": "none", "log.tensorboard": False}
    return Trainer(nn.Linear(6, 2), FlakyImages(tmp_path), loss_fn=nn.functional.cross_entropy, config=config,
                   run_dir=tmp_path / "run")


@pytest.mark.parametrize("workers", [0, 2])
def test_fail_names_the_sample_and_file(tmp_path: Path, workers: int) -> None:
    trainer = _trainer(tmp_path, "fail", workers)
    with pytest.raises(RunError) as err:
        trainer.fit()
    message = str(err.value)
    assert message.startswith("training failed at step ")
    assert "BadSample: sample " in message and "set data.on_error=skip" in message
    assert "Traceback" not in message and "\n" not in message
    first_bad = [line for line in message.split("BadSample: ")[1:]][0]
    if first_bad.startswith("sample 22"):
        assert first_bad.startswith("sample 22 (file ") and "ValueError: cannot decode pixel data" in first_bad
    else:
        index = int(first_bad.split()[1])
        assert index in BAD and f"(file {tmp_path}/img{index:03d}.png): OSError: cannot identify image file" in first_bad
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_drops_and_counts_bad_samples(tmp_path: Path, workers: int, gputrain_warnings: list[str]) -> None:
    summary = _trainer(tmp_path, "skip", workers).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 8
    assert summary["data"]["skipped_samples"] == 2 * len(BAD)  # every sample is drawn once per epoch
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["data"]["skipped_samples"] == 6
    skipping = [m for m in gputrain_warnings if "skipping unreadable samples" in m]
    assert len(skipping) == 1 and "sample " in skipping[0]  # once, with an example


def test_skip_count_survives_resume(tmp_path: Path) -> None:
    assert _trainer(tmp_path, "skip", 0, epochs=1).fit()["data"]["skipped_samples"] == 3
    summary = _trainer(tmp_path, "skip", 0, epochs=2).fit()
    assert summary["data"]["skipped_samples"] == 6
