"""Every way a run ends leaves summary.json (status, step, and for failures the error) and, for
failures, error.log: a NaN stop, a crash in the test evaluation or the final save, a signal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from gputrain import Trainer
from gputrain.data.tensors import TensorData
from gputrain.errors import Interrupted, RunError
from gputrain.train.checkpointer import Checkpointer
from gputrain.train.nonfinite import NonFiniteStep

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.epochs": 2,
         "train.batch_size": 16, "log.every_steps": 1}


def _data(n: int = 64) -> TensorData:
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def _summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def test_a_nan_stop_leaves_a_failed_summary_naming_the_step(tmp_path: Path) -> None:
    calls = [0]

    def poisoned(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        loss = F.cross_entropy(outputs, targets)
        return loss * float("nan") if calls[0] == 3 else loss

    trainer = Trainer(nn.Linear(6, 3), _data(), loss_fn=poisoned, config=QUIET, run_dir=tmp_path)
    with pytest.raises(NonFiniteStep, match="step 3: loss is nan"):
        trainer.fit()
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and summary["global_step"] == 2
    assert summary["error"].startswith("step 3: loss is nan; the step was not applied")
    assert "NonFiniteStep" in (tmp_path / "error.log").read_text()


class BrokenAt(Dataset):
    """A test split whose 5th sample cannot be read."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == 4:
            raise OSError("disk gone")
        return torch.randn(6), torch.tensor(i % 3)


def test_a_crash_in_the_final_test_evaluation_is_recorded(tmp_path: Path) -> None:
    trainer = Trainer(nn.Linear(6, 3), _data(), test_data=BrokenAt(), config=QUIET, run_dir=tmp_path)
    with pytest.raises(RunError, match=r"training failed at the test evaluation after step 8: \w+: .*disk gone"):
        trainer.fit()
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and summary["global_step"] == 8 and summary["test"] == {}
    assert "disk gone" in (tmp_path / "error.log").read_text()


def test_a_crash_in_the_final_save_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(self: Checkpointer, path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Checkpointer, "save_final_weights", full_disk)
    with pytest.raises(RunError, match="no space left on the device"):  # said as what it is (run/fs_errors.py)
        Trainer(nn.Linear(6, 3), _data(), config=QUIET, run_dir=tmp_path).fit()
    assert _summary(tmp_path)["status"] == "failed" and (tmp_path / "error.log").is_file()
    assert not (tmp_path / "model.safetensors").exists()


def test_an_interrupted_run_says_so_in_its_summary(tmp_path: Path) -> None:
    trainers: list[Trainer] = []

    def stop_at_step_2(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        trainers[0].stop.requested = "SIGTERM"  # what the signal handler does
        return F.cross_entropy(outputs, targets)

    trainers.append(Trainer(nn.Linear(6, 3), _data(), loss_fn=stop_at_step_2, config=QUIET, run_dir=tmp_path))
    with pytest.raises(Interrupted):
        trainers[0].fit()
    summary = _summary(tmp_path)
    assert summary["status"] == "interrupted" and summary["global_step"] == 1
    assert not (tmp_path / "error.log").exists()
