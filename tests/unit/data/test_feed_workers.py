"""data.num_workers=auto from the cores of this rank and the data set's size."""

from __future__ import annotations

import contextlib
import multiprocessing
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from gputrain import Trainer
from gputrain.data.tensors import TensorData
from gputrain.errors import RunError
from gputrain.data import feed
from gputrain.data.feed import auto_num_workers, auto_prefetch_factor
from tests.sim_clock import SimClock


class Sized(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize(("cores", "local_ranks", "size", "expected"), [
    (16, "1", 100_000, 15),  # every spare core: one GPU needs all of them to decode images
    (64, "1", 100_000, 16),  # capped
    (16, "4", 100_000, 3),   # 4 ranks share 16 cores: 4 each, one for the rank itself
    (16, "1", 500, 2),       # a small data set does not pay for more workers
    (1, "1", 100_000, 0),    # no spare core: load in the main process
])
def test_auto_workers(monkeypatch: pytest.MonkeyPatch, cores: int, local_ranks: str, size: int, expected: int) -> None:
    monkeypatch.setattr(feed.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_ranks)
    assert auto_num_workers("auto", Sized(size)) == expected


def test_explicit_and_in_memory() -> None:
    assert auto_num_workers(3, Sized(10)) == 3
    assert auto_num_workers("auto", TensorData(torch.zeros(4, 2), torch.zeros(4))) == 0
    assert auto_prefetch_factor(0) is None and auto_prefetch_factor(1) == 8 and auto_prefetch_factor(8) == 2


class Records(Dataset):
    """Samples read by user code from tensors in memory: a dict of rows."""

    def __init__(self, n: int = 256, cost_s: float = 0.0, clock: SimClock | None = None) -> None:
        self.x, self.y = torch.randn(n, 5), torch.randint(0, 3, (n,))
        self.cost_s, self.clock = cost_s, clock

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.clock is not None:
            self.clock.advance(self.cost_s)  # a row from memory, or a file read and a decode
        return {"features": self.x[i], "label": self.y[i]}


def test_cheap_samples_are_read_in_this_process_and_costly_ones_by_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feed.os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    # each sample read costs its simulated time (collating costs none): the answer no load can change
    clock = SimClock()
    cheap, costly = Records(cost_s=2e-6, clock=clock), Records(cost_s=1e-3, clock=clock)
    assert auto_num_workers("auto", cheap, micro_batch=64, clock=clock) == 0  # 128 us a batch: no worker pays
    assert auto_num_workers("auto", Records(cost_s=5e-6, clock=clock), micro_batch=64, clock=clock) == 2  # 320 us
    assert auto_num_workers("auto", costly, micro_batch=64, clock=clock) == 2  # 64 ms a batch: workers
    assert auto_num_workers(1, cheap, micro_batch=64, clock=clock) == 1  # an explicit count is kept


def _step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"])


def _failing_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    raise RuntimeError("user code fails")


@pytest.mark.parametrize("step_fn", [_step, _failing_step])
def test_fit_ends_its_loader_workers(tmp_path: Path, step_fn) -> None:
    """Persistent workers live between epochs, not after the run, however it ends."""
    config = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.batch_size": 16,
              "checkpoint.enabled": False, "data.num_workers": 1, "train.epochs": 2}
    before = set(multiprocessing.active_children())
    for i in range(2):
        trainer = Trainer(torch.nn.Linear(5, 3), Records(64), step_fn=step_fn, config=config, run_dir=tmp_path / str(i))
        with contextlib.suppress(RunError):
            trainer.fit()
        assert set(multiprocessing.active_children()) == before
