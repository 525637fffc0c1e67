"""The suite that tests/unit/suite/test_ctrl_c.py runs in a pytest of its own and interrupts: one
failure first, then a test that is inside gputrain when the Ctrl-C comes (MARK written at that
point), then one that must not run. Not collected by the suite (no test_ prefix)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from gputrain import Trainer
from gputrain.errors import Interrupted
from gputrain.interrupts import startup_signals


def _mark() -> None:
    Path(os.environ["MARK"]).write_text("here")


def test_a_fails() -> None:
    assert 1 == 2


def test_b_while_a_command_starts() -> None:
    """gputrain's start-up guard is armed (as `gputrain train` arms it before its heavy imports):
    it ends a command at once with exit 130, which took the whole session with it."""
    with startup_signals("train"):
        _mark()
        threading.Event().wait(120)  # the Ctrl-C comes while this waits


class _MarkAtStep:
    def on_step_end(self, trainer: object, step: int, metrics: object) -> None:
        if step == 2:
            _mark()


def test_b_while_a_run_trains(tmp_path: Path) -> None:
    """A run's handler takes the first Ctrl-C: the run checkpoints and stops, as it should for a user;
    the session went on to the next test."""
    data = TensorDataset(torch.randn(64, 5), torch.randint(0, 3, (64,)))
    config = {"train.device": "cpu", "train.epochs": 100_000, "train.batch_size": 8, "log.progress": "none",
              "log.tensorboard": False}
    trainer = Trainer(nn.Linear(5, 3), data, config=config, run_dir=tmp_path / "run", callbacks=[_MarkAtStep()])
    with pytest.raises(Interrupted):
        trainer.fit()


def test_c_after_the_interrupt() -> None:
    Path(os.environ["MARK"] + ".c").write_text("ran")
