"""One tune from start to end: the plan's space of candidates (`plan_space`), auto's layout first as
the baseline, each candidate measured within the budget (scheduler.py, trial.py), a line as each
starts and its row as it ends, and tune.json rewritten after every row (a tune stopped half-way keeps
what it measured).

The budget's last CONFIRM_SHARE goes to measuring the CONFIRM fastest rows once more each, in turn:
each row's figures become its median run's, so one lucky short run on a busy machine does not win.

`run_tune` is the command's body and the API the tests and benchmarks/tune_cpu.py call: `trial`,
`select` (which candidates to measure) and `clock` can be given.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain.errors import RunError
from gputrain.terminal import printable
from gputrain.tune.candidates import AUTO, Candidate, Space, generate
from gputrain.tune.scheduler import PRUNED, Result, Trial, best, confirm, run_candidates

if TYPE_CHECKING:
    from gputrain.config.schema import Config

COMPILE_MODES: dict[str, tuple[bool, ...]] = {"try": (False, True), "off": (False,), "on": (True,)}
CONFIRM = 3
"""The fastest rows measured once more each at the end (scheduler.confirm)."""
CONFIRM_SHARE = 0.2
"""Of the budget, what the first pass leaves for confirming."""


@dataclass(slots=True)
class TuneJob:
    config: Config
    config_file: str | None
    overrides: list[str]
    run_dir: Path
    budget_s: float
    max_ranks: int
    baseline_ranks: int = 1
    """Ranks of the baseline: the config as given with parallel.strategy=auto."""
    micro_batches: int = 3
    compile: tuple[bool, ...] = (False, True)
    confirm: int = CONFIRM


def plan_space(job: TuneJob) -> Space:
    """The candidates' space, the memory plan answering which layouts fit (plan/planner.py's rows,
    on fake tensors: nothing is allocated) and which the model cannot take (plan/feasible.py)."""
    import torch

    from gputrain.cli.plan import build_plan_target
    from gputrain.data import build_data
    from gputrain.data.tensors import TensorData
    from gputrain.distributed.auto import device_memory, format_bytes
    from gputrain.plan.feasible import row_problem
    from gputrain.plan.layouts import usable_bytes
    from gputrain.plan.planner import PlanTarget, layout_row
    from gputrain.tune.fingerprint import usable_cores

    config = job.config
    target, _, _ = build_plan_target(config, 1)
    by_accum: dict[int, PlanTarget] = {}

    def with_accum(accum: int) -> PlanTarget:
        if accum not in by_accum:  # a step of `accum` micro-batches: measured apart (the cache is per accum)
            by_accum[accum] = dataclasses.replace(target, accum=accum, _cache={}, _stages={})
        return by_accum[accum]

    def fits(ranks: int, strategy: str, ac: str, micro: int, accum: int) -> str | None:
        limit = device_memory(target.device, ranks)
        row, _ = layout_row(with_accum(accum), micro, ranks, strategy, ac, False, limit.bytes)  # type: ignore[arg-type]
        if row.fits:
            return None
        return f"{format_bytes(row.layout.total)} planned per rank, {format_bytes(usable_bytes(limit.bytes))} usable"

    def left_out(ranks: int, strategy: str) -> str | None:
        return row_problem(target.model, strategy, ranks, config.parallel.pp_schedule)  # type: ignore[arg-type]

    def auto_threads(ranks: int) -> int:
        from gputrain.env.threads import auto_threads as free_cores
        from gputrain.env.threads import collect_cpu_share

        return free_cores(collect_cpu_share(ranks), "cpu").threads

    train = build_data(config.data, config.train.seed).train
    return Space(
        batch_size=int(config.train.batch_size),
        max_ranks=job.max_ranks,
        cores=usable_cores(),
        device_type=target.device.type,
        fits=fits,
        loader_fed=not isinstance(train, (TensorData, torch.utils.data.TensorDataset)),
        micro_batches=job.micro_batches,
        compile=job.compile,
        left_out=left_out,
        auto_threads=auto_threads,
    )


def run_tune(
    job: TuneJob,
    *,
    trial: Trial | None = None,
    select: Callable[[Candidate], bool] = lambda c: True,
    clock: Callable[[], float] = time.monotonic,
    say: Callable[[str], None] = lambda line: print(printable(line), flush=True),
) -> list[Result]:
    """Every row: measured, skipped, pruned by what failed, or left out by the plan (with why)."""
    from gputrain.tune import table
    from gputrain.tune.fingerprint import config_fields, machine
    from gputrain.tune.trial import TrainTrial

    space = plan_space(job)
    candidates, pruned = generate(space)
    todo = [c for c in [Candidate(job.baseline_ranks, AUTO), *candidates] if select(c)]
    runner = trial or TrainTrial(job.config_file, job.overrides, space.batch_size)
    warmup, timed = getattr(runner, "warmup", None), getattr(runner, "timed", None)
    say(
        f"gputrain tune: {len(todo)} candidates ({len(pruned)} left out by the plan), budget {job.budget_s:.0f} s; "
        f"each a real gputrain train of {warmup} warm-up + {timed} timed steps of batch {space.batch_size}, "
        "in fresh processes"
    )
    say(table.header())
    left_out = [Result(p.candidate, PRUNED, p.reason) for p in pruned]
    for row in left_out:
        say(table.row(row))
    facts = machine(space.device_type)
    fields = config_fields(job.config)
    began = clock()
    done: list[Result] = []

    def save() -> None:
        write_record(job.run_dir, [*done, *left_out], facts, fields, job, clock() - began, space.batch_size, runner)

    def started(i: int, c: Candidate, left: float) -> None:
        say(f"[{i + 1}/{len(todo)}] {c.label()} ({left:.0f} s of the budget left)")

    def finished(i: int, r: Result) -> None:
        done.append(r)
        say(table.row(r))
        save()

    first_pass = job.budget_s * (1 - CONFIRM_SHARE) if job.confirm > 1 else job.budget_s
    run_candidates(todo, runner, first_pass, clock, on_start=started, on_result=finished)

    def again(i: int, c: Candidate, left: float) -> None:
        say(f"[again {i + 1}/{job.confirm}] {c.label()} ({left:.0f} s of the budget left)")

    def confirmed(i: int, r: Result) -> None:
        say(table.row(r))
        save()

    confirm(done, runner, job.confirm, job.budget_s - (clock() - began), clock, on_start=again, on_result=confirmed)
    save()
    return [*done, *left_out]


def write_record(
    run_dir: Path,
    results: list[Result],
    facts: dict[str, Any],
    fields: dict[str, Any],
    job: TuneJob,
    spent: float,
    batch_size: int,
    runner: Any,
) -> None:
    from gputrain.run.files import write_json
    from gputrain.run.output import make_folder
    from gputrain.tune.record import TUNE, tune_record

    make_folder(run_dir, "--run-dir")
    record = tune_record(
        results,
        machine=facts,
        fields=fields,
        budget_s=job.budget_s,
        spent_s=spent,
        batch_size=batch_size,
        warmup=getattr(runner, "warmup", None),
        timed=getattr(runner, "timed", None),
    )
    write_json(run_dir / TUNE, record)


def conclude(job: TuneJob, results: list[Result], say: Callable[[str], None] = print) -> int:
    """The winner against auto's baseline, and how to train with it.

    Raises:
        RunError: no candidate ran to its end (exit 1; tune.json keeps every row's why).
    """
    from gputrain.tune.record import TUNE, default_tune_dir

    path = job.run_dir / TUNE
    winner = best(results)
    if winner is None or winner.throughput is None:
        raise RunError(f"tune: no candidate ran to its end within the budget (each row says why: {path})")
    auto = next((r for r in results if r.candidate.strategy == AUTO and r.status == "ok"), None)
    unit = "tokens/s" if winner.tokens_per_s is not None else "samples/s"
    versus = (
        f", {winner.throughput / auto.throughput:.2f}× auto's {auto.throughput:,.0f}"
        if auto is not None and auto.throughput
        else ""
    )
    config = job.config
    named = (
        "" if job.run_dir == default_tune_dir(config.model.name, config.data.name) else f" parallel.tune_file={path}"
    )
    say(printable(f"winner: {winner.candidate.label()}: {winner.throughput:,.0f} {unit}{versus}"))
    say(printable(f"tune.json: {path}; train with it: gputrain train parallel.strategy=tuned{named}"))
    return 0
