"""Copy batch n+1 to the GPU on a side stream while batch n computes.

The host batches come from pinned memory (the DataLoader pins them), so the copies are truly
asynchronous. Before batch n is used, the compute stream waits on an event recorded after its
copy (not on the whole side stream, which by then also carries batch n+1's copy), and every
tensor is marked with `record_stream` so the caching allocator does not hand its memory to the
next copy while the compute stream still reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from gputrain.observe.breakdown import StepTimer


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, dict):
        for item in batch.values():
            yield from _tensors(item)


def prefetch_to_cuda(
    groups: Iterator[list[Any]], device: torch.device, move: Callable[[Any], Any], timer: StepTimer
) -> Iterator[list[Any]]:
    """Yield each group of micro-batches on `device`, its copy issued one step ahead.

    Args:
        groups: host micro-batch lists, one per optimizer step.
        move: copies one host batch to the device (non_blocking); runs on the side stream.
        timer: marks "h2d" when the compute stream has waited for the copy.
    """
    side = torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)

    def issue(group: list[Any]) -> tuple[list[Any], torch.cuda.Event]:
        # New allocations on the side stream come from its own pool, so the copy need not wait for
        # compute; record_stream (in _ready) keeps the memory alive until compute is done with it.
        with torch.cuda.stream(side):
            moved = [move(b) for b in group]
            done = torch.cuda.Event()
            done.record(side)
        return moved, done

    pending: tuple[list[Any], torch.cuda.Event] | None = None
    for group in groups:
        issued = issue(group)
        if pending is not None:
            yield _ready(pending, compute, timer)
        pending = issued
    if pending is not None:
        yield _ready(pending, compute, timer)


def _ready(pending: tuple[list[Any], torch.cuda.Event], compute: torch.cuda.Stream, timer: StepTimer) -> list[Any]:
    moved, done = pending
    compute.wait_event(done)
    for batch in moved:
        for tensor in _tensors(batch):
            tensor.record_stream(compute)
    timer.mark("h2d")
    return moved
