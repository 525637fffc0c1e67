"""Time a piece of device work properly: warm-up, synchronisation or CUDA events, median.

The first calls pay for allocation, kernel selection (cuBLAS heuristics, cuDNN autotuning) and
lazy initialisation, so they are run untimed. CUDA work is asynchronous: host clocks around a
launch measure the launch, not the kernel, hence CUDA events recorded on the stream.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["SLOW_RANK_ENV", "Timing", "measure", "rank_clock", "synchronize"]

SLOW_RANK_ENV = "GPUTRAIN_TEST_BENCH_SLOW_RANK"
"""Test hook: on the rank it names, `rank_clock` runs 1000× fast, so that rank's warm-up ends sooner
and its time budget fits fewer repeats than its peers' (as on a slower or busier device)."""


@dataclass(frozen=True)
class Timing:
    """Seconds per call of each timed repeat (warm-up calls excluded)."""

    times_s: tuple[float, ...]
    warmup: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def repeats(self) -> int:
        return len(self.times_s)


def rank_clock(rank: int) -> Callable[[], float]:
    """The host clock of rank `rank` (`time.perf_counter`, or 1000× fast under SLOW_RANK_ENV)."""
    if os.environ.get(SLOW_RANK_ENV) != str(rank):
        return time.perf_counter
    return lambda: time.perf_counter() * 1000.0


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on `device` (a no-op on the CPU, where ops are synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    *,
    warmup: int = 2,
    repeats: int = 10,
    min_repeats: int = 3,
    budget_s: float | None = None,
    min_warmup_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    agree: Callable[[int], int] | None = None,
) -> Timing:
    """Call `fn` `warmup` times untimed, then time `repeats` calls one by one.

    Args:
        fn: the work; it must not return before its work is queued on `device`.
        device: where the work runs; CUDA is timed with events, anything else with `clock`.
        warmup: untimed calls first.
        repeats: timed calls (at most).
        min_repeats: timed calls at least, when `budget_s` cuts `repeats` down.
        budget_s: seconds the timed calls should take in all: the warm-up's duration per call
            sets how many fit, so slow machines do fewer repeats instead of taking forever.
        min_warmup_s: keep warming up until this long has passed. CPUs need it: clocks and
            thread pools take a fraction of a second to ramp up (measured: a 2-core VM runs
            matmul at a third of its speed for the first 0.6 s).
        clock: host clock (injected by tests).
        agree: the count to use, on every process, from this one's (`agreed_count`: rank 0's).
            Work that holds a collective must be called equally often on every rank, while each
            rank's clock would end its warm-up and size its repeats differently; every count
            decided from a clock goes through it (each warm-up call, then the repeats).

    Returns:
        The per-call times; use `.median_s`. `.warmup` is the number of untimed calls made.
    """
    if warmup < 0 or repeats < 1 or min_repeats < 1:
        raise ValueError("need warmup >= 0, repeats >= 1 and min_repeats >= 1")
    device = torch.device(device)
    same = agree or (lambda count: count)
    start = clock()
    calls = 0
    while same(int(calls < warmup or (calls > 0 and clock() - start < min_warmup_s))):
        fn()
        synchronize(device)
        calls += 1
    if budget_s is not None and calls > 0:
        per_call = max((clock() - start) / calls, 1e-9)
        repeats = max(min_repeats, min(repeats, int(budget_s / per_call)))
    repeats = same(repeats)
    if device.type == "cuda":
        return Timing(_cuda_event_times(fn, device, repeats), calls)
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        synchronize(device)
        times.append(clock() - t0)
    return Timing(tuple(times), calls)


def _cuda_event_times(fn: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, ...]:
    # Events are recorded on the stream between launches, so the host never waits mid-loop and
    # the GPU runs back to back; one synchronize at the end reads them all.
    with torch.cuda.device(device):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
    return tuple(start.elapsed_time(end) / 1000.0 for start, end in events)
