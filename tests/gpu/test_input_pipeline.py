"""The CUDA input pipeline: prefetched batches equal the host batches; conv nets go channels_last."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gputrain.data.augment import apply_channels_last
from gputrain.observe.breakdown import StepTimer
from gputrain.data.feed import to_device
from gputrain.data.prefetch import prefetch_to_cuda

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_prefetched_batches_match_host_batches() -> None:
    device = torch.device("cuda", 0)
    host = [[(torch.randn(64, 3, 32, 32).pin_memory(), torch.arange(64).pin_memory())] for _ in range(5)]
    got = list(prefetch_to_cuda(iter(host), device, lambda b: to_device(b, device), StepTimer(device, 0)))
    assert len(got) == 5
    for (h,), (d,) in zip(host, got):
        assert d[0].device == device
        assert torch.equal(d[0].cpu(), h[0]) and torch.equal(d[1].cpu(), h[1])


def test_conv_net_weights_channels_last_on_cuda() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()).cuda()
    assert apply_channels_last(model, torch.device("cuda", 0))
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not apply_channels_last(nn.Linear(2, 2).cuda(), torch.device("cuda", 0))


def test_pageable_batches_are_pinned_on_the_fly_and_arrive_equal() -> None:
    """A user's DataLoader without pin_memory: the prefetcher pins each batch before its copy."""
    device = torch.device("cuda", 0)
    host = [[(torch.randn(64, 3, 32, 32), torch.arange(64))] for _ in range(4)]
    assert not host[0][0][0].is_pinned()
    got = list(prefetch_to_cuda(iter(host), device, lambda b: to_device(b, device), StepTimer(device, 0)))
    for (h,), (d,) in zip(host, got):
        assert torch.equal(d[0].cpu(), h[0]) and torch.equal(d[1].cpu(), h[1])
