"""Measuring the candidates within a time budget, one at a time (each has the machine to itself).

- The budget: a candidate is started only where the time it is expected to take fits in what is
  left (`Estimates`: the measured wall time of the most alike candidates run so far); a running one
  is given what is left as its timeout and killed there (trial.py). Nothing measured yet: the first
  candidate starts, bounded by the whole budget. Nor may one candidate eat the budget: where alike
  ones (same ranks and compile setting) were measured, it is stopped at SLOWER_BY × the quickest of
  them (at least MIN_LIMIT_S): start-up costs them alike, so by then its steps are slower than that one's.
- Pruning by what was measured: where a layout failed (crash, out of memory) at
  micro-batch b, it is not tried at any larger one (`Candidate.family`).
- A failure is a result row (status and one line of why), never a failure of the tune.

The clock is injected (`clock`), so the budget is tested with a fake one, by counting the
candidates started.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gputrain.tune.candidates import Candidate

OK = "ok"
FAILED_STATUSES = ("failed", "oom")
"""What prunes the layout at larger micro-batches; a timeout is the budget's end, not the layout's."""
SKIPPED = "skipped"
SLOWER_BY = 3.0
MIN_LIMIT_S = 30.0
PRUNED = "pruned"


@dataclass(slots=True)
class Result:
    candidate: Candidate
    status: str
    """ok, failed, oom, timeout (measured); pruned, skipped (not run)."""
    reason: str = ""
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    compile_s: float | None = None
    """The warm-up steps' time beyond the steady state's (compilation, first-step allocation)."""
    peak_memory_by_rank: list[int | None] = field(default_factory=list)
    wall_s: float | None = None
    """The whole trial: start-up, steps, the end's evaluation."""
    measured: list[float] = field(default_factory=list)
    """Every run's throughput where the row was measured again (`confirm`); its figures are then
    the median run's."""

    @property
    def throughput(self) -> float | None:
        return self.tokens_per_s if self.tokens_per_s is not None else self.samples_per_s

    def add_run(self, again: Result) -> None:
        """Another measurement of this candidate: the row's figures become those of the median run."""
        runs = self._runs if self._runs else [dataclasses.replace(self, measured=[])]
        runs.append(again)
        runs.sort(key=lambda r: r.throughput or 0.0)
        median = runs[(len(runs) - 1) // 2]  # of an even count the lower: a noisy high run does not win
        self.samples_per_s, self.tokens_per_s = median.samples_per_s, median.tokens_per_s
        self.step_time_s, self.compile_s = median.step_time_s, median.compile_s
        self.measured = [r.throughput or 0.0 for r in runs]
        self._runs = runs

    _runs: list[Result] = field(default_factory=list, repr=False, compare=False, init=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.as_dict(),
            "label": self.candidate.label(),
            "overrides": self.candidate.overrides(),
            "status": self.status,
            "reason": self.reason,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": self.step_time_s,
            "compile_s": self.compile_s,
            "peak_memory_by_rank": self.peak_memory_by_rank,
            "wall_s": self.wall_s,
            "measured": self.measured,
        }


Trial = Callable[[Candidate, float], Result]
"""Runs one candidate with a timeout in seconds; returns its row (never raises for the run's failure)."""


class Estimates:
    """How long a candidate is expected to take: the mean wall time of those measured with the same
    ranks and compile setting, else with the same compile setting, else of all; None: none yet."""

    def __init__(self) -> None:
        self.walls: list[tuple[Candidate, float]] = []

    def add(self, candidate: Candidate, wall_s: float) -> None:
        self.walls.append((candidate, wall_s))

    def limit(self, candidate: Candidate) -> float | None:
        """The most this candidate may run: SLOWER_BY × the quickest alike (same ranks and compile
        setting: their start-up and compilation cost the same), at least MIN_LIMIT_S; None where none
        alike was measured."""
        compiled = candidate.compile or candidate.cuda_graphs
        alike = [w for c, w in self.walls if c.ranks == candidate.ranks and (c.compile or c.cuda_graphs) == compiled]
        return max(MIN_LIMIT_S, SLOWER_BY * min(alike)) if alike else None

    def expect(self, candidate: Candidate) -> float | None:
        compiled = candidate.compile or candidate.cuda_graphs
        tests: list[Callable[[Candidate], bool]] = [
            lambda c: c.ranks == candidate.ranks and (c.compile or c.cuda_graphs) == compiled,
            lambda c: (c.compile or c.cuda_graphs) == compiled,
            lambda c: True,
        ]
        for test in tests:
            alike = [w for c, w in self.walls if test(c)]
            if alike:
                return sum(alike) / len(alike)
        return None


def run_candidates(
    candidates: Sequence[Candidate],
    trial: Trial,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
    on_start: Callable[[int, Candidate, float], None] = lambda i, c, left: None,
    on_result: Callable[[int, Result], None] = lambda i, r: None,
) -> list[Result]:
    """Every candidate's row, in order: measured, or skipped/pruned with why."""
    began = clock()
    estimates = Estimates()
    failed_at: dict[tuple[Any, ...], int] = {}
    results: list[Result] = []
    for i, candidate in enumerate(candidates):
        left = budget_s - (clock() - began)
        result = _not_to_run(candidate, failed_at, estimates, left)
        if result is None:
            on_start(i, candidate, left)
            start = clock()
            cap = estimates.limit(candidate)
            result = trial(candidate, left if cap is None else min(left, cap))
            if result.status == "timeout" and cap is not None and cap < left:
                result.reason = (
                    f"stopped at {cap:.0f} s, {SLOWER_BY:g}× the quickest alike candidate: slower than that one"
                )
            if result.wall_s is None:
                result.wall_s = clock() - start
            if result.status in FAILED_STATUSES and candidate.micro_batch is not None:
                family = candidate.family()
                failed_at[family] = min(failed_at.get(family, candidate.micro_batch), candidate.micro_batch)
            if result.status != "timeout":  # a timeout's wall time is the budget's, not the candidate's
                estimates.add(candidate, result.wall_s)
        results.append(result)
        on_result(i, result)
    return results


def _not_to_run(
    candidate: Candidate, failed_at: dict[tuple[Any, ...], int], estimates: Estimates, left: float
) -> Result | None:
    smallest_failed = failed_at.get(candidate.family())
    if smallest_failed is not None and candidate.micro_batch is not None and candidate.micro_batch > smallest_failed:
        return Result(candidate, PRUNED, f"this layout failed at micro-batch {smallest_failed}")
    if left <= 0:
        return Result(candidate, SKIPPED, "the budget is spent")
    expected = estimates.expect(candidate)
    if expected is not None and expected > left:
        return Result(candidate, SKIPPED, f"would need ~{expected:.0f} s; {left:.0f} s of the budget left")
    return None


def best(results: Sequence[Result], ranks: int | None = None) -> Result | None:
    """The measured row of the highest throughput (of `ranks` ranks where given); a tie goes to the
    earlier row (fewer ranks, no compile: the order of candidates.py)."""
    rows = [r for r in results if r.status == OK and r.throughput and (ranks is None or r.candidate.ranks == ranks)]
    if not rows:
        return None
    top = max(r.throughput or 0.0 for r in rows)
    return next(r for r in rows if r.throughput == top)


def confirm(
    results: Sequence[Result],
    trial: Trial,
    count: int,
    left_s: float,
    clock: Callable[[], float] = time.monotonic,
    on_start: Callable[[int, Candidate, float], None] = lambda i, c, left: None,
    on_result: Callable[[int, Result], None] = lambda i, r: None,
) -> int:
    """The `count` fastest measured rows run once more each, in turn, while the budget's `left_s`
    holds a run as long as the row's first; each row's figures become its median run's. On a shared
    machine one short run can be lucky: the winner is the one that stays fastest. Returns the runs made."""
    top = sorted((r for r in results if r.status == OK and r.throughput), key=lambda r: -(r.throughput or 0.0))
    top = top[:count] if count > 1 else []
    began, made = clock(), 0
    for i, row in enumerate(top):
        left = left_s - (clock() - began)
        if row.wall_s is None or row.wall_s > left:
            continue
        on_start(i, row.candidate, left)
        again = trial(row.candidate, left)
        made += 1
        if again.status == OK and again.throughput:
            row.add_run(again)
        on_result(i, row)
    return made
