"""The run shell around a loop of one's own: a loop that supplies only its steps, one stateful part
and its summary figures gets what the Trainer and PPO get: a checkpoint on a signal holding that
part, a resume that puts it back and continues where it stopped, summary.json with the loop's block,
and a complete run kept as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gputrain.config import load_config
from gputrain.data.tensors import TensorData
from gputrain.errors import Interrupted
from gputrain.run.record import LoopFigures
from gputrain.run.shell import LoopShape, RunShell
from gputrain.run.signals import StoppedBySignal
from gputrain.train.build import TrainingParts, build_training

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.batch_size": 8,
         "log.every_steps": 1, "train.max_steps": 6}


class Tally:
    """A stateful part of the loop's own: what it has counted (in every checkpoint)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def state_dict(self) -> dict[str, Any]:
        return {"seen": list(self.seen)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = list(state["seen"])


class CountingLoop:
    """A loop of one's own on gputrain's parts: SGD steps on the run's optimizer, a tally of steps."""

    def __init__(self, run_dir: Path, stop_at: int | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        data = TensorData(torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g))
        torch.manual_seed(0)
        self.parts: TrainingParts = build_training(load_config(None, QUIET), nn.Linear(4, 2), data, run_dir=run_dir)
        self.tally, self.stop_at = Tally(), stop_at
        self.checked: list[Path] = []
        shape = LoopShape(total=6, unit="round", longer="rounds")
        self.shell = RunShell(self.parts, self.parts.place.config, shape, self._figures, states={"tally": self.tally},
                              checks=(lambda path, saved: self.checked.append(path),))

    def fit(self) -> dict[str, Any]:
        return self.shell.run(self._train)

    def _train(self) -> str:
        state, parts = self.shell.state, self.parts
        while state.global_step < 6:
            loss = parts.model(torch.ones(1, 4)).sum()
            loss.backward()
            parts.optimizer.step()
            parts.optimizer.zero_grad()
            state.global_step += 1
            self.tally.seen.append(state.global_step)
            if state.global_step == self.stop_at:
                self.shell.stop.requested = "SIGTERM"  # what the signal handler does
            if self.shell.stop_requested(True):
                self.shell.interrupted()
        return "completed"

    def _figures(self, status: str) -> LoopFigures:
        return LoopFigures(blocks={"tally": {"rounds": len(self.tally.seen), "status_seen": status}})


def test_a_loop_of_its_own_stops_on_a_signal_and_resumes_its_part(tmp_path: Path) -> None:
    first = CountingLoop(tmp_path, stop_at=3)
    with pytest.raises(StoppedBySignal, match="stopped by SIGTERM at round 3; checkpoint saved at") as info:
        first.fit()
    assert isinstance(info.value, Interrupted)
    stopped = json.loads((tmp_path / "summary.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["global_step"] == 3
    assert stopped["tally"] == {"rounds": 3, "status_seen": "interrupted"}
    saved = torch.load(tmp_path / "checkpoints" / "step-3" / "state.pt", weights_only=True)
    assert saved["tally"] == {"seen": [1, 2, 3]} and saved["loop"]["global_step"] == 3

    second = CountingLoop(tmp_path)
    summary = second.fit()
    assert second.checked == [tmp_path / "checkpoints" / "step-3"]  # the part's own check ran on resume
    assert second.tally.seen == [1, 2, 3, 4, 5, 6]  # restored, then continued
    assert summary["status"] == "completed" and summary["global_step"] == 6
    assert summary["tally"] == {"rounds": 6, "status_seen": "completed"}
    assert (tmp_path / "model.safetensors").is_file()

    # the same weights as a run that was never stopped
    whole = CountingLoop(tmp_path / "whole")
    whole.fit()
    for a, b in zip(second.parts.model.parameters(), whole.parts.model.parameters(), strict=True):
        assert torch.equal(a, b)

    kept = CountingLoop(tmp_path)  # complete: kept as it is, nothing trained
    assert kept.fit() == summary and kept.tally.seen == []
