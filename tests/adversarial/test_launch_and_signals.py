"""Launch and start (issue 34, class 7), tried as a careless user and a busy machine would:

* every rank reaches each collective of a timed loop equally often: rank 0 decides how many warm-up
  calls and repeats fit its time budget and broadcasts the count (before, a rank whose clock ran
  differently ran more all-reduces, then met its peer's 4-byte one: gloo aborted);
* a signal at any stage of the start-up (from the first instruction of the entry point) ends with
  one line and exit 130, as later, and with summary.json where a run directory is written;
* a rendezvous endpoint that cannot be used (a name that does not resolve, a closed port, no port)
  is one line naming it and what to check, exit 2, within a bounded wait, before torchrun starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gputrain.bench.timing import SLOW_RANK_ENV, measure
from gputrain.distributed.context import agreed_count
from tests.conftest import ROOT
from tests.dist.harness import run_ranks


# ----------------------------------------------------------------------------- collectives in timed loops
def _allreduce_bench_counted(rank: int, slow_rank: int) -> tuple[int, float]:
    """On one rank of a real gloo job: the all-reduce benchmark at its CPU quick settings (a time
    budget, a warm-up of at least 0.75 s), with `slow_rank`'s clock running 1000× fast; returns how
    many all-reduces this rank ran and its figure (the slowest rank's, the same on every rank)."""
    import torch.distributed as dist

    from gputrain.bench.comms import bench_allreduce
    from gputrain.bench.result import settings_for

    os.environ[SLOW_RANK_ENV] = str(slow_rank)
    dist.init_process_group("gloo")
    calls = 0
    real = dist.all_reduce

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    dist.all_reduce = counted  # type: ignore[assignment]
    result = bench_allreduce(torch.device("cpu"), settings_for("cpu", quick=True))
    assert result is not None
    return calls, result.value


@pytest.mark.slow
@pytest.mark.parametrize("slow_rank", [1, 0], ids=["rank-1-slow", "rank-0-slow"])
def test_every_rank_runs_rank_0s_count_of_timed_all_reduces(slow_rank: int) -> None:
    """Rank `slow_rank` would end its warm-up after one call and fit the fewest repeats; its peer
    warms up for 0.75 s and fits more. With rank 0's counts broadcast, both run the same number."""
    (calls_0, figure_0), (calls_1, figure_1) = run_ranks(_allreduce_bench_counted, slow_rank, timeout_s=240)
    assert calls_0 == calls_1, (calls_0, calls_1)
    assert figure_0 == figure_1 > 0


# a clock that advances 1 s per reading, and agreements that override what the clock decides
_AGREED = [
    (None, 3, 4),  # no group: the local decisions (warm-up: 1 call, then min_warmup_s of 2 readings; repeats 4)
    ("warmup-longer", 6, 4),  # rank 0 wanted 6 warm-up calls
    ("repeats-more", 3, 9),  # rank 0 fitted 9 repeats
]


@pytest.mark.parametrize(("agreed", "warmup_calls", "repeats"), _AGREED, ids=["local", "warmup", "repeats"])
def test_measure_runs_the_agreed_counts(agreed: str | None, warmup_calls: int, repeats: int) -> None:
    ticks = iter(range(10_000))
    decisions: list[int] = []

    def agree(local: int) -> int:
        decisions.append(local)
        if agreed == "warmup-longer" and len(decisions) <= 6:
            return 1  # go on warming up, whatever this clock says
        if agreed == "repeats-more" and local > 1:
            return 9
        return local

    timing = measure(
        lambda: None,
        warmup=1,
        repeats=4,
        min_repeats=1,
        budget_s=100,
        min_warmup_s=2.5,
        clock=lambda: float(next(ticks)),
        agree=agree if agreed else None,
    )
    assert (timing.warmup, timing.repeats) == (warmup_calls, repeats)


def test_agreed_count_outside_a_job_is_the_local_count() -> None:
    assert agreed_count(7, torch.device("cpu")) == 7


@pytest.mark.slow
def test_torchrun_bench_quick_on_two_ranks_completes_with_one_rank_slow(tmp_path: Path) -> None:
    """The command of the report: `torchrun --nproc-per-node 2 -m gputrain bench --quick`, rank 1's
    clock 1000× fast; before, gloo aborted (`op.preamble.length <= op.nbytes`)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), SLOW_RANK_ENV: "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "gputrain",
            "bench",
            "--quick",
            "--json",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (figure,) = json.loads(result.stdout)["results"]
    assert figure["bench"] == "allreduce_busbw" and figure["value"] > 0
