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
from pathlib import Path

from gputrain.config.docs import fields_help_text
from gputrain.errors import ConfigError, UsageError

DEFAULT_BUDGET = "5m"
MICRO_BATCHES_MAX = 8
CONFIRM_MAX = 16


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
        "--confirm",
        type=int,
        default=3,
        metavar="K",
        help="the K fastest measured once more at the end, each kept at its median run (default 3; 0: off)",
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
    from gputrain.tune.session import COMPILE_MODES, TuneJob, conclude, run_tune

    budget = budget_seconds(args.budget)
    if not 1 <= args.micro_batches <= MICRO_BATCHES_MAX:
        raise UsageError(f"--micro-batches {args.micro_batches}: must be 1..{MICRO_BATCHES_MAX}")
    if not 0 <= args.confirm <= CONFIRM_MAX:
        raise UsageError(f"--confirm {args.confirm}: must be 0..{CONFIRM_MAX}")
    config = load_config(args.config, args.overrides)
    if not isinstance(config.train.batch_size, int):
        raise UsageError(
            "train.batch_size=auto: tune keeps the global batch fixed (the optimisation unchanged); give a number"
        )
    run_dir = Path(args.run_dir) if args.run_dir is not None else default_tune_dir(config.model.name, config.data.name)
    check_tune_dir(run_dir)
    from gputrain.env.device import resolve_device

    device = resolve_device(config.train.device)[0]
    job = TuneJob(
        config=config,
        config_file=args.config,
        overrides=list(args.overrides),
        run_dir=run_dir,
        budget_s=budget,
        max_ranks=_max_ranks(args.nproc_per_node, device.type),
        baseline_ranks=args.nproc_per_node or 1,
        micro_batches=args.micro_batches,
        compile=COMPILE_MODES[args.compile],
        confirm=args.confirm,
    )
    results = run_tune(job)
    return conclude(job, results)


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
    from gputrain.tune.fingerprint import usable_cores

    return usable_cores()


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
