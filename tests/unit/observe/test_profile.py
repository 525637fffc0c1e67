"""`gputrain profile` on real runs: a deliberately slow data set is data-bound, a healthy run is not."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from gputrain import Trainer
from gputrain.data.tensors import TensorData
from gputrain.observe.breakdown import StepTimer
from gputrain.train import device_guard
from tests.sim_clock import SimClock

ROOT = Path(__file__).resolve().parents[3]
QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False,
         "train.epochs": 1, "train.max_steps": 6, "train.batch_size": 8, "log.breakdown_every": 1}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimClock:
    """The step-time split's clock, advanced only by the simulated work below: the shares the advisor
    judges are exact, whatever else the machine is running."""
    sim = SimClock()
    monkeypatch.setattr("gputrain.observe.speed.StepTimer", functools.partial(StepTimer, clock=sim))
    return sim


def computing(model: nn.Module, clock: SimClock, seconds: float) -> nn.Module:
    """`model`, each forward pass taking `seconds` of the simulated clock."""
    model.register_forward_hook(lambda *_: clock.advance(seconds))
    return model


class SlowData(Dataset):
    def __init__(self, clock: SimClock) -> None:
        self.clock = clock

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.clock.advance(0.003)  # decoding an image from a slow disk, say
        return torch.full((8,), float(i)), torch.tensor(i % 2)


def test_slow_dataset_gives_data_bound_finding(tmp_path: Path, clock: SimClock) -> None:
    model = computing(nn.Linear(8, 2), clock, 0.001)  # 8 samples of 3 ms against 1 ms of compute
    trainer = Trainer(model, SlowData(clock), config={**QUIET, "data.num_workers": 0}, run_dir=tmp_path)
    report = trainer.profile()
    assert report.facts.data_fraction == pytest.approx(0.024 / 0.025)
    workers = min(max(report.facts.cpu_count - 1, 1), 4)  # a worker per spare core, 4 at most
    assert [str(f) for f in report.findings] == [
        f"data-bound: the training waits for data 96% of each step → data.num_workers={workers} (0 now)"]
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("name") == "aten::addmm" for e in trace["traceEvents"])  # a real Chrome trace
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert saved["findings"][0]["bottleneck"] == "data-bound"


def test_healthy_run_has_no_finding(tmp_path: Path, clock: SimClock, monkeypatch: pytest.MonkeyPatch) -> None:
    data = TensorData(torch.randn(64, 64), torch.randint(0, 2, (64,)))
    real_batch = TensorData.batch

    def indexing(self: TensorData, *args: Any, **kwargs: Any) -> Any:
        clock.advance(0.001)  # a batch's rows gathered from memory
        return real_batch(self, *args, **kwargs)

    monkeypatch.setattr(TensorData, "batch", indexing)
    model = computing(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 2)), clock, 0.010)
    report = Trainer(model, data, config=QUIET, run_dir=tmp_path).profile()
    assert report.facts.data_fraction == pytest.approx(0.001 / 0.011)  # under the advisor's 15%
    assert report.findings == []
    assert report.top_host_ops and report.top_device_ops == []  # no device on this machine


def test_the_guards_own_sync_is_not_blamed_on_the_user(tmp_path: Path) -> None:
    """The non-finite guard reads one flag per step; a step_fn calling .item() adds a sync of its own."""
    data = TensorData(torch.randn(64, 8), torch.randint(0, 2, (64,)))

    def with_item(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        print(f"loss {loss.item():.3f}", end="\r")  # the habit the advisor warns about
        return loss

    ours = Trainer(nn.Linear(8, 2), data, config=QUIET, run_dir=tmp_path / "ours").profile().facts
    users = Trainer(nn.Linear(8, 2), data, step_fn=with_item, config=QUIET,
                                    run_dir=tmp_path / "users").profile().facts
    assert ours.syncs_per_step == 0  # the guard's flag and the logging step's reads are labelled as ours
    assert users.syncs_per_step is not None and users.syncs_per_step >= 1


def test_gputrains_own_syncs_are_counted_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the device-side guard gputrain reads the device on logging steps only; the host-side
    guard (an optimizer that cannot skip an update itself) reads its flag every step."""
    data = TensorData(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    config = {**QUIET, "log.breakdown_every": 100}  # the time split reads the clock's events on its sampled steps
    monkeypatch.setattr(device_guard, "ON_CPU", True)  # a GPU's guard, on CPU tensors
    on_device = Trainer(nn.Linear(8, 2), data, config=config, run_dir=tmp_path / "device").profile().facts
    monkeypatch.setattr(device_guard, "fits", lambda *args: False)
    on_host = Trainer(nn.Linear(8, 2), data, config=config, run_dir=tmp_path / "host").profile().facts
    assert on_device.own_syncs_per_step is not None and on_device.own_syncs_per_step < 1
    assert on_host.own_syncs_per_step is not None and on_host.own_syncs_per_step >= 1
    assert on_device.syncs_per_step == on_host.syncs_per_step == 0


def test_cli_prints_top_ops_and_findings(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gputrain", "profile", "--run-dir", str(tmp_path), "--steps", "4",
                             "model.name=mlp", "train.device=cpu", "log.progress=none"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "top ops by host time" in result.stdout
    assert "findings: none" in result.stdout
    assert (tmp_path / "trace.json").is_file()


def test_cli_rejects_too_few_steps(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gputrain", "profile", "--steps", "2"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("gputrain profile: --steps must be at least 3 (1 skipped, 1 warm-up, "
                                     "1 or more recorded), got 2")
