"""`gputrain tune`: which layout that fits is fastest, measured (gputrain/tune/).

The memory plan gives the layouts that fit on 1..--nproc-per-node ranks; each, crossed with the
micro-batch (the global batch fixed), threads per rank, compile, CUDA graphs and loader workers, runs
a few steps as a real `gputrain train` in fresh processes within --budget; a progress line per
candidate and the table as it fills; tune.json in --run-dir (default runs/<model>-<data>-tune/),
which `gputrain train parallel.strategy=tuned` applies and `gputrain report DIR` draws.
Exit codes: 0 a candidate ran (the winner is kept); 1 none did; 2 bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain.config.docs import fields_help_text
from gputrain.errors import ConfigError, RunError, UsageError

if TYPE_CHECKING:
    from gputrain.config.schema import Config
    from gputrain.tune.candidates import Candidate, Space
    from gputrain.tune.scheduler import Result

DEFAULT_BUDGET = "5m"
MICRO_BATCHES_MAX = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file (overrides still apply on top)")
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        help="where tune.json goes (default runs/<model>-<data>-tune/, where parallel.strategy=tuned looks)",
    )
    parser.add_argument(
        "--budget",
        default=DEFAULT_BUDGET,
        metavar="TIME",
        help=f"the most the measuring may take: 90s, 5m, 1h30m or seconds (default {DEFAULT_BUDGET})",
    )
    parser.add_argument(
        "--nproc-per-node", type=int, metavar="N", help="try 1..N ranks (default: the GPUs, or 1 on a CPU)"
    )
    parser.add_argument(
        "--micro-batches", type=int, default=3, metavar="K", help="micro-batch sizes tried per layout (default 3)"
    )
    parser.add_argument(
        "--compile",
        choices=("try", "off", "on"),
        default="try",
        help="torch.compile: try both (default), never, or always",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="config overrides, as for gputrain train"
    )
    parser.epilog = fields_help_text()


def budget_seconds(text: str) -> float:
    from gputrain.config.durations import duration_seconds

    try:
        return duration_seconds(text, "--budget")
    except ConfigError as err:
        raise UsageError(f"--budget {text[:40]!r}: {err.problem}") from None


def run(args: argparse.Namespace) -> int:
    from gputrain.config import load_config
    from gputrain.tune.record import default_tune_dir

    budget = budget_seconds(args.budget)
    if not 1 <= args.micro_batches <= MICRO_BATCHES_MAX:
        raise UsageError(f"--micro-batches {args.micro_batches}: must be 1..{MICRO_BATCHES_MAX}")
    config = load_config(args.config, args.overrides)
    if not isinstance(config.train.batch_size, int):
        raise UsageError(
            "train.batch_size=auto: tune keeps the global batch fixed (the optimisation unchanged); give a number"
        )
    run_dir = Path(args.run_dir) if args.run_dir is not None else default_tune_dir(config.model.name, config.data.name)
    check_tune_dir(run_dir)
    from gputrain.env.device import resolve_device

    device = resolve_device(config.train.device)[0]
    ranks = _max_ranks(args.nproc_per_node, device.type)
    return tune(args, config, run_dir, budget, ranks, device.type)


def _max_ranks(given: int | None, device_type: str) -> int:
    """--nproc-per-node within what this machine can start: a GPU per rank, a core per gloo rank."""
    import torch

    from gputrain.distributed.launch import check_ranks_per_node

    if device_type == "cuda":
        most, what = torch.cuda.device_count(), "GPUs (one per rank)"
    else:
        most, what = _cores(), "cores this process may use (one per gloo rank)"
    if given is None:
        return most if device_type == "cuda" else 1
    if given < 1:
        raise UsageError(f"--nproc-per-node {given}: must be at least 1")
    if given > most:
        raise UsageError(f"--nproc-per-node {given}: this machine has {most} {what}; give at most {most}")
    check_ranks_per_node(given)
    return given


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_tune_dir(run_dir: Path) -> None:
    """Where tune.json goes (run/output.py's rules): a new or empty folder, or a tune's own.

    Raises:
        UsageError: naming --run-dir, the path and what would be right.
    """
    from gputrain.run.files import check_run_dir, run_dir_path
    from gputrain.run.layout import REPORT
    from gputrain.run.output import Owner, check_output_file, check_output_folder
    from gputrain.tune.record import TUNE, is_tune_record

    run_dir = run_dir_path(str(run_dir))
    owner = Owner.of(runs=[run_dir], designated=[TUNE])

    def ours(folder: Path) -> bool:
        names = {p.name for p in folder.iterdir()}
        return TUNE in names and names <= {TUNE, REPORT}

    check_output_folder(run_dir, "--run-dir", owner, ours)
    check_output_file(run_dir / TUNE, "--run-dir", owner, is_tune_record)
    check_run_dir(run_dir)


def plan_space(config: Config, max_ranks: int, micro_batches: int, compile_mode: str) -> Space:
    """The candidates' space, the plan answering which fit (plan/planner.py's rows per rank count)."""
    import torch

    from gputrain.cli.plan import build_plan_target
    from gputrain.data import build_data
    from gputrain.data.tensors import TensorData
    from gputrain.distributed.auto import device_memory, format_bytes
    from gputrain.plan.feasible import row_problem
    from gputrain.plan.layouts import usable_bytes
    from gputrain.plan.planner import PlanTarget, layout_row
    from gputrain.tune.candidates import Space

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

    bundle = build_data(config.data, config.train.seed)
    return Space(
        batch_size=int(config.train.batch_size),
        max_ranks=max_ranks,
        cores=_cores(),
        device_type=target.device.type,
        fits=fits,
        loader_fed=not isinstance(bundle.train, (TensorData, torch.utils.data.TensorDataset)),
        micro_batches=micro_batches,
        compile={"try": (False, True), "off": (False,), "on": (True,)}[compile_mode],
        left_out=lambda ranks, strategy: row_problem(target.model, strategy, ranks, config.parallel.pp_schedule),  # type: ignore[arg-type]
    )


def tune(args: argparse.Namespace, config: Config, run_dir: Path, budget: float, max_ranks: int, device: str) -> int:
    from gputrain.tune.candidates import AUTO, Candidate, generate
    from gputrain.tune.fingerprint import config_fields, machine
    from gputrain.tune.scheduler import PRUNED, Result, run_candidates
    from gputrain.tune.trial import TrainTrial

    space = plan_space(config, max_ranks, args.micro_batches, args.compile)
    candidates, pruned = generate(space)
    baseline = Candidate(args.nproc_per_node or 1, AUTO)
    todo = [baseline, *candidates]
    trial = TrainTrial(args.config, list(args.overrides), space.batch_size)
    print(
        f"gputrain tune: {len(todo)} candidates ({len(pruned)} left out by the plan), budget {budget:.0f} s, each "
        f"{trial.warmup} warm-up + {trial.timed} timed steps of batch {space.batch_size} in fresh processes",
        flush=True,
    )
    print(_header(), flush=True)
    rows: list[Result] = [Result(p.candidate, PRUNED, p.reason) for p in pruned]
    facts = machine(device)
    fields = config_fields(config)
    began = time.monotonic()
    done: list[Result] = []

    def save() -> None:
        _write(run_dir, [*done, *rows], facts, fields, budget, time.monotonic() - began, trial)

    def started(i: int, c: Candidate, left: float) -> None:
        print(f"[{i + 1}/{len(todo)}] {c.label()} ({left:.0f} s of the budget left)", flush=True)

    def finished(i: int, r: Result) -> None:
        done.append(r)
        print(_row(r), flush=True)
        save()

    run_candidates(todo, trial, budget, on_start=started, on_result=finished)
    save()
    return _conclude(run_dir, [*done, *rows], config)


def _write(
    run_dir: Path,
    results: list[Result],
    facts: dict[str, Any],
    fields: dict[str, Any],
    budget: float,
    spent: float,
    trial: Any,
) -> None:
    from gputrain.run.files import write_json
    from gputrain.run.output import make_folder
    from gputrain.tune.record import TUNE, tune_record

    make_folder(run_dir, "--run-dir")
    record = tune_record(
        results,
        machine=facts,
        fields=fields,
        budget_s=budget,
        spent_s=spent,
        batch_size=trial.batch_size,
        warmup=trial.warmup,
        timed=trial.timed,
    )
    write_json(run_dir / TUNE, record)


def _header() -> str:
    return f"{'status':<8} {'candidate':<44} {'samples/s':>10} {'step ms':>8} {'compile s':>9}  peak MiB per rank"


def _row(r: Result) -> str:
    from gputrain.terminal import printable

    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    peaks = ",".join("-" if p is None else f"{p / 2**20:.0f}" for p in r.peak_memory_by_rank) or "-"
    line = (
        f"{r.status:<8} {r.candidate.label():<44} {num(r.samples_per_s, ',.0f'):>10} "
        f"{num(None if r.step_time_s is None else r.step_time_s * 1000, '.1f'):>8} "
        f"{num(r.compile_s, '.1f'):>9}  {peaks}"
    )
    return printable(line + (f"  {r.reason}" if r.reason else ""))


def _conclude(run_dir: Path, results: list[Result], config: Config) -> int:
    from gputrain.terminal import printable
    from gputrain.tune.record import TUNE, default_tune_dir
    from gputrain.tune.scheduler import best

    winner = best(results)
    path = run_dir / TUNE
    if winner is None:
        raise RunError(f"tune: no candidate ran to its end within the budget (each row says why; {path})")
    auto = next((r for r in results if r.candidate.strategy == "auto" and r.status == "ok"), None)
    unit = "tokens/s" if winner.tokens_per_s is not None else "samples/s"
    versus = (
        f", {winner.throughput / auto.throughput:.2f}× auto's {auto.throughput:,.0f}"
        if auto is not None and auto.throughput
        else ""
    )
    named = "" if run_dir == default_tune_dir(config.model.name, config.data.name) else f" parallel.tune_file={path}"
    print(printable(f"winner: {winner.candidate.label()}: {winner.throughput:,.0f} {unit}{versus}"))
    print(printable(f"tune.json: {path}; train with it: gputrain train parallel.strategy=tuned{named}"))
    return 0
