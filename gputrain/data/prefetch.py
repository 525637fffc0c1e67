"""Copy batch n+1 to the GPU on a side stream while batch n computes.

A copy overlaps compute only from pinned (page-locked) host memory: from pageable memory CUDA stages
the bytes through a driver buffer and `cudaMemcpyAsync` returns only when the last of them is staged,
so a `non_blocking` copy holds the host for the whole transfer and the step after it is queued late.
The DataLoader gputrain builds pins its batches, and in-memory data is gathered into pinned memory
(feed.py); a batch that comes pageable (a user's DataLoader without `pin_memory=True`) is pinned here
first: a host memcpy at memory speed, into blocks torch's caching host allocator reuses, after which
the DMA runs at the link's pinned rate while the host goes on (benchmarks/RESULTS.md, the
prefetcher's analysis).

Order, per step: batch n+1 is fetched and its copy issued on the side stream before batch n is
handed out (apex's data_prefetcher's order), so the copy is queued while step n still runs on the
device even where step n ends with a host sync (a logging step). Before batch n is used, the compute
stream waits on an event recorded after its copy (not on the whole side stream, which by then also
carries batch n+1's copy), and every tensor is marked with `record_stream` so the caching allocator
does not hand its memory to the next copy while the compute stream still reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from gputrain.observe.breakdown import StepTimer


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            yield from _tensors(item)
    elif isinstance(batch, Mapping):
        for item in batch.values():
            yield from _tensors(item)


def pinned(batch: Any) -> Any:
    """`batch` with each pageable host tensor replaced by a pinned copy (pinned ones, device tensors
    and non-tensors as they are); containers are rebuilt only where something was pinned."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" and not batch.is_pinned() else batch
    if isinstance(batch, (list, tuple)):
        items = [pinned(b) for b in batch]
        if all(new is old for new, old in zip(items, batch)):
            return batch
        return items if isinstance(batch, list) else tuple(items)  # as to_device rebuilds them
    if isinstance(batch, Mapping):
        values = {k: pinned(v) for k, v in batch.items()}
        return batch if all(values[k] is v for k, v in batch.items()) else values
    return batch


def prefetch_to_cuda(
    groups: Iterator[list[Any]],
    device: torch.device,
    move: Callable[[Any], Any],
    timer: StepTimer,
    pin: bool = True,
) -> Iterator[list[Any]]:
    """Yield each group of micro-batches on `device`, its copy issued one step ahead.

    Args:
        groups: host micro-batch lists, one per optimizer step.
        move: copies one host batch to the device (non_blocking); runs on the side stream, on a
            pinned batch.
        timer: marks "h2d" when the compute stream has waited for the copy.
        pin: pin pageable host tensors before their copy (off: copied from pageable memory, as
            benchmarks/proof_pipeline.py measures it against).
    """
    side = torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)

    def issue(group: list[Any]) -> tuple[list[Any], torch.cuda.Event]:
        host = [pinned(b) for b in group] if pin else group  # pageable: the host held for the whole copy
        # New allocations on the side stream come from its own pool, so the copy need not wait for
        # compute; record_stream (in _ready) keeps the memory alive until compute is done with it.
        with torch.cuda.stream(side):
            moved = [move(b) for b in host]
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
