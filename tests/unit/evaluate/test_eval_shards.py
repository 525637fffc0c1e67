"""Evaluation shares of a split under DDP: together they are the split, each sample once."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from gputrain.data.tensors import TensorData
from gputrain.evaluate.evaluator import shard_for_eval


class Numbers(Dataset):
    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i)]), i


@pytest.mark.parametrize("world", [1, 2, 3, 4, 16])
def test_shares_cover_the_split_once(world: int) -> None:
    tensors = TensorData(torch.arange(11.0).view(11, 1), torch.arange(11))
    for data in (tensors, Numbers()):
        seen = [int(shard_for_eval(data, r, world)[i][1]) for r in range(world)
                for i in range(len(shard_for_eval(data, r, world)))]
        assert sorted(seen) == list(range(11))
        sizes = [len(shard_for_eval(data, r, world)) for r in range(world)]
        assert max(sizes) - min(sizes) <= 1
