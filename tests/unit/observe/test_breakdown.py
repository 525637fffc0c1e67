"""The step-time breakdown: only sampled steps are timed, each interval lands in its category."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from gputrain import Trainer
from gputrain.observe.breakdown import StepTimer
from tests.sim_clock import SimClock


def test_intervals_go_to_their_categories() -> None:
    clock = iter([0.0, 0.5, 0.6, 1.6, 1.8, 2.0,     # step 2: data .5, h2d .1, fwd+bwd 1, optim .2, other .2
                  10.0, 10.1, 10.1, 10.5, 10.6, 10.6])  # step 4
    timer = StepTimer(torch.device("cpu"), every=2, clock=lambda: next(clock))
    for step in range(1, 5):
        timer.begin(step)
        for category in ("data", "h2d", "forward_backward", "optimizer"):
            timer.mark(category)
        timer.end()
    mean = timer.mean_seconds()
    assert timer.sampled_steps == 2  # steps 1 and 3 took no clock reading at all
    assert mean == pytest.approx({"data": 0.3, "h2d": 0.05, "forward_backward": 0.7, "optimizer": 0.15,
                                  "comm": 0.0, "other": 0.1})
    assert sum(timer.fractions().values()) == pytest.approx(1.0)  # type: ignore[union-attr]


def test_off_when_every_is_zero() -> None:
    timer = StepTimer(torch.device("cpu"), every=0)
    timer.begin(25)
    timer.mark("data")
    timer.end()
    assert timer.mean_seconds() is None and timer.fractions() is None


class SlowData(Dataset):
    """Every sample costs 4 ms (of `clock`) to load: a data-bound job."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.clock.advance(0.004)
        return torch.full((8,), float(i)), torch.tensor(i % 2)


def test_slow_dataset_shows_as_data_time(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Through the real loop, on a clock only the simulated work moves: 32 ms of loading a step
    against 1 ms of a forward pass."""
    clock = SimClock()
    monkeypatch.setattr("gputrain.observe.speed.StepTimer", functools.partial(StepTimer, clock=clock))
    model = nn.Linear(8, 2)
    model.register_forward_hook(lambda *_: clock.advance(0.001))
    config = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False,
              "train.epochs": 1, "train.batch_size": 8, "data.num_workers": 0, "log.breakdown_every": 2}
    summary = Trainer(model, SlowData(clock), config=config, run_dir=tmp_path).fit()
    train = summary["train"]
    assert train["time_breakdown_steps"] == 4  # steps 2, 4, 6, 8 of 8
    assert train["time_breakdown"] == pytest.approx({"data": 32 / 33, "h2d": 0.0, "forward_backward": 1 / 33,
                                                     "optimizer": 0.0, "comm": 0.0, "other": 0.0})
    assert train["time_breakdown_s"]["data"] == pytest.approx(0.032, abs=1e-6)


def test_a_run_shorter_than_the_sampling_interval_still_reports_its_split() -> None:
    import torch

    from gputrain.observe.breakdown import StepTimer

    timer = StepTimer(torch.device("cpu"), every=25)
    for step in range(1, 6):  # a 5-step run: no 25th step
        timer.begin(step)
        timer.mark("data")
        timer.mark("forward_backward")
        timer.end()
    fractions = timer.fractions()
    assert fractions is not None and abs(sum(fractions.values()) - 1) < 1e-9
    assert timer.steps_behind_mean == 2  # steps 2 and 3; step 1 (FLOP counting, warm-up) never
    for step in range(6, 26):  # once a regular sample exists, it alone is reported
        timer.begin(step)
        timer.mark("data")
        timer.end()
    assert timer.fractions() is not None and timer.steps_behind_mean == 1
