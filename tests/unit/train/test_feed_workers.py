"""data.num_workers=auto from the cores of this rank and the data set's size."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from gputrain.data.tensors import TensorData
from gputrain.train import feed
from gputrain.train.feed import auto_num_workers, auto_prefetch_factor


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
