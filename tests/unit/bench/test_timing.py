"""The timing helper, with an injected clock: exact answers, no sleeping."""

from __future__ import annotations

import pytest
import torch

from gputrain.bench.timing import measure


class FakeWork:
    """Each call "takes" the next duration on a fake clock."""

    def __init__(self, durations: list[float]) -> None:
        self.durations = list(durations)
        self.now = 0.0
        self.calls = 0

    def clock(self) -> float:
        return self.now

    def __call__(self) -> None:
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1


def test_warmup_calls_are_not_timed_and_the_median_is_of_the_repeats():
    # The two slow warm-up calls (first-call costs) must not leak into the figures.
    work = FakeWork([9.0, 8.0, 0.3, 0.1, 0.5, 0.2, 0.4])
    timing = measure(work, warmup=2, repeats=5, clock=work.clock)
    assert work.calls == 7
    assert timing.warmup == 2 and timing.repeats == 5
    assert timing.times_s == pytest.approx((0.3, 0.1, 0.5, 0.2, 0.4))
    assert timing.median_s == pytest.approx(0.3)
    assert timing.min_s == pytest.approx(0.1)


def test_budget_cuts_repeats_but_not_below_the_minimum():
    work = FakeWork([1.0])
    timing = measure(work, warmup=2, repeats=10, budget_s=5.0, clock=work.clock)
    assert timing.repeats == 5  # 5 s of budget at 1 s per call
    work = FakeWork([1.0])
    assert measure(work, warmup=1, repeats=10, budget_s=0.5, min_repeats=3, clock=work.clock).repeats == 3


def test_min_warmup_seconds_keeps_warming_up():
    work = FakeWork([0.1])
    timing = measure(work, warmup=1, repeats=3, min_warmup_s=0.5, clock=work.clock)
    assert timing.warmup == 5  # 1 required call, then until 0.5 s had passed
    assert work.calls == 8


def test_real_cpu_work_is_timed():
    a = torch.randn(64, 64)
    timing = measure(lambda: a @ a, "cpu", warmup=1, repeats=4)
    assert timing.repeats == 4 and all(t > 0 for t in timing.times_s)


def test_bad_arguments():
    with pytest.raises(ValueError):
        measure(lambda: None, repeats=0)
