"""One intra-op thread while these tests run: timing assertions must not hinge on a second
OpenMP thread being scheduled on a busy 2-core machine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
