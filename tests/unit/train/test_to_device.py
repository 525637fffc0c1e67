"""Batches moved to the device whatever holds their tensors."""

from __future__ import annotations

from collections import UserDict

import torch

from gputrain.data.feed import to_device


def test_a_mapping_that_is_no_dict_is_moved() -> None:
    """Hugging Face collators give `BatchEncoding`s, a UserDict: their tensors were left on the host."""
    meta = torch.device("meta")
    batch = UserDict({"input_ids": torch.zeros(2, 3), "labels": [torch.ones(2)]})
    moved = to_device((batch, torch.ones(1)), meta)
    assert moved[0]["input_ids"].device == meta and moved[0]["labels"][0].device == meta
    assert moved[1].device == meta
