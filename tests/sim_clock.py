"""A clock that moves only when a test says so: durations a machine's load cannot change.

Product code that times something takes its clock as a parameter (`time.perf_counter` by default);
a test passes a `SimClock` and advances it where the work it simulates happens (a sample read, a
forward pass, a save), so every measured share and every decision made on one is exact.
"""

from __future__ import annotations


class SimClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
