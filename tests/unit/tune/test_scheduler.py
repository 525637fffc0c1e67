"""The budget and the pruning by what was measured (tune/scheduler.py), on a simulated clock: the
candidates started are counted, no wall-clock threshold."""

from __future__ import annotations

from gputrain.tune.candidates import Candidate
from gputrain.tune.scheduler import Result, best, confirm, run_candidates
from tests.sim_clock import SimClock


class FakeTrial:
    """Takes `seconds` of the simulated clock per candidate; `fail(c)` gives the status of a failure."""

    def __init__(self, clock: SimClock, seconds: float, fail=lambda c: None, speed=lambda c: 100.0):
        self.clock, self.seconds, self.fail, self.speed = clock, seconds, fail, speed
        self.started: list[Candidate] = []
        self.timeouts: list[float] = []

    def __call__(self, c: Candidate, timeout_s: float) -> Result:
        self.started.append(c)
        self.timeouts.append(timeout_s)
        if self.seconds > timeout_s:  # killed at the budget, as trial.py does
            self.clock.advance(timeout_s)
            return Result(c, "timeout", "still running when the budget ran out")
        self.clock.advance(self.seconds)
        status = self.fail(c)
        if status:
            return Result(c, status, "forced")
        return Result(c, "ok", samples_per_s=self.speed(c))


def _cands(n: int, ranks: int = 1) -> list[Candidate]:
    return [Candidate(ranks, "none", 2**i, 1, threads=1) for i in range(n)]


def test_no_candidate_starts_that_cannot_finish_in_what_is_left():
    clock = SimClock()
    trial = FakeTrial(clock, 10.0)
    results = run_candidates(_cands(6), trial, 35.0, clock)
    assert len(trial.started) == 3  # 10 + 10 + 10; the 4th would need ~10 s with 5 s left
    assert [r.status for r in results] == ["ok"] * 3 + ["skipped"] * 3
    assert "would need ~10 s; 5 s of the budget left" in results[3].reason
    assert trial.timeouts == [35.0, 25.0, 15.0]  # each may run at most what is left


def test_the_first_candidate_starts_bounded_by_the_budget_and_a_timeout_is_a_row():
    clock = SimClock()
    trial = FakeTrial(clock, 50.0)
    results = run_candidates(_cands(3), trial, 20.0, clock)
    assert len(trial.started) == 1
    assert results[0].status == "timeout"
    assert [r.reason for r in results[1:]] == ["the budget is spent"] * 2


def test_a_layout_that_fails_at_b_is_not_tried_at_2b_but_others_are():
    clock = SimClock()
    fail = {(1, 4): "oom"}
    trial = FakeTrial(clock, 1.0, fail=lambda c: fail.get((c.threads, c.micro_batch)))
    one = [Candidate(1, "none", m, 8 // m, threads=1) for m in (2, 4, 8)]
    two = [Candidate(1, "none", m, 8 // m, threads=2) for m in (2, 4, 8)]
    results = run_candidates([*one, *two], trial, 100.0, clock)
    assert [r.status for r in results] == ["ok", "oom", "pruned", "ok", "ok", "ok"]
    assert results[2].reason == "this layout failed at micro-batch 4"
    assert len(trial.started) == 5


def test_a_failure_is_a_row_and_the_best_is_the_fastest_measured():
    clock = SimClock()
    speeds = {1: 10.0, 2: 30.0, 4: 20.0}
    trial = FakeTrial(
        clock, 1.0, fail=lambda c: "failed" if c.micro_batch == 8 else None, speed=lambda c: speeds[c.micro_batch]
    )
    results = run_candidates(_cands(4), trial, 100.0, clock)
    assert [r.status for r in results] == ["ok", "ok", "ok", "failed"]
    assert best(results).candidate.micro_batch == 2
    assert best(results, ranks=2) is None


def test_estimates_come_from_the_most_alike_candidates():
    clock = SimClock()
    cands = [Candidate(1, "none", 1, 1), Candidate(1, "none", 1, 1, compile=True), Candidate(1, "none", 2, 1)]

    def trial(c: Candidate, timeout_s: float) -> Result:
        clock.advance(30.0 if c.compile else 5.0)
        return Result(c, "ok", samples_per_s=1.0)

    # 5 s measured without compile: the compiled one is expected at ~5 s too (nothing alike yet) and
    # starts with 45 s left; its 30 s then do not count against the third, expected at 5 s
    results = run_candidates(cands, trial, 50.0, clock)
    assert [r.status for r in results] == ["ok", "ok", "ok"]


def test_one_slow_candidate_is_stopped_at_3x_the_quickest_alike_and_does_not_eat_the_budget():
    clock = SimClock()
    walls = {1: 20.0, 2: 500.0, 4: 20.0, 8: 50.0}

    def trial(c: Candidate, timeout_s: float) -> Result:
        if walls[c.micro_batch] > timeout_s:
            clock.advance(timeout_s)
            return Result(c, "timeout", "killed")
        clock.advance(walls[c.micro_batch])
        return Result(c, "ok", samples_per_s=1.0)

    cands = [Candidate(1, "none", m, 1, threads=t) for m, t in ((1, 1), (8, 8), (2, 2), (4, 4))]
    results = run_candidates(cands, trial, 400.0, clock)
    assert [r.status for r in results] == ["ok", "ok", "timeout", "ok"]
    assert results[2].reason.startswith("stopped at 60 s, 3× the quickest alike candidate")
    assert clock() == 150.0  # 20 + 50 + 60 + 20, not the budget


def test_the_first_of_more_ranks_is_not_held_to_the_one_process_runs_time():
    clock = SimClock()

    def trial(c: Candidate, timeout_s: float) -> Result:
        seconds = 10.0 if c.ranks == 1 else 45.0  # torchrun and two ranks start slower
        if seconds > timeout_s:
            clock.advance(timeout_s)
            return Result(c, "timeout", "killed")
        clock.advance(seconds)
        return Result(c, "ok", samples_per_s=1.0)

    cands = [Candidate(1, "none", 8, 1, threads=1), Candidate(2, "ddp", 4, 1, threads=1)]
    assert [r.status for r in run_candidates(cands, trial, 200.0, clock)] == ["ok", "ok"]


def test_confirming_keeps_each_row_at_its_median_run_so_a_lucky_run_does_not_win():
    clock = SimClock()
    runs = {1: [300.0, 90.0, 95.0], 2: [200.0, 210.0], 4: [100.0, 100.0]}
    made: list[int] = []

    def trial(c: Candidate, timeout_s: float) -> Result:
        clock.advance(10.0)
        made.append(c.micro_batch)
        return Result(c, "ok", samples_per_s=runs[c.micro_batch].pop(0))

    cands = [Candidate(1, "none", m, 1, threads=1) for m in (1, 2, 4)]
    results = run_candidates(cands, trial, 30.0, clock)
    assert best(results).candidate.micro_batch == 1  # 300 at its first, lucky, run
    assert confirm(results, trial, 2, 25.0, clock) == 2  # the two fastest once more; the third was not
    assert made == [1, 2, 4, 1, 2]
    assert results[0].measured == [90.0, 300.0] and results[0].samples_per_s == 90.0
    assert best(results).candidate.micro_batch == 2
    assert results[0].as_dict()["measured"] == [90.0, 300.0]


def test_confirming_runs_only_what_fits_in_what_is_left():
    clock = SimClock()

    def trial(c: Candidate, timeout_s: float) -> Result:
        clock.advance(10.0)
        return Result(c, "ok", samples_per_s=float(c.micro_batch))

    results = run_candidates(_cands(3), trial, 100.0, clock)
    assert confirm(results, trial, 3, 15.0, clock) == 1
    assert confirm(results, trial, 1, 100.0, clock) == 0  # one row has nothing to be confirmed against
