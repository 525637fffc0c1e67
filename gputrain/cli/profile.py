"""`gputrain profile`: a short training under torch.profiler, the top ops, and what to change."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gputrain.cli.launching import add_launch_arguments, is_launcher, launch_ranks, prepare_run
from gputrain.config.docs import RL_SECTION, fields_help_text
from gputrain.errors import UsageError

if TYPE_CHECKING:
    from gputrain.observe.profiler import ProfileReport
    from gputrain.train.trainer import Trainer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file (overrides still apply on top)")
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        help="where trace.json, memory_snapshot.pickle and "
        "profile.json go (default runs/<model>-<data>-<time>-profile/)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=12,
        help="optimizer steps to run (1 skipped, 1 warm-up, the rest recorded; default 12)",
    )
    parser.add_argument("--top", type=int, default=10, help="ops to list by device and by host time")
    add_launch_arguments(parser, restarts=False)
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="config overrides, as for gputrain train"
    )
    parser.epilog = fields_help_text(omit=(RL_SECTION,))


def _fmt_us(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def run(args: argparse.Namespace) -> int:
    from gputrain.interrupts import startup_signals

    if args.steps < 3:
        raise UsageError(f"--steps must be at least 3 (1 skipped, 1 warm-up, 1 or more recorded), got {args.steps}")
    forced = [
        f"train.max_steps={args.steps}",
        "checkpoint.enabled=false",
        "checkpoint.resume=never",
        "log.tensorboard=false",
        'log.mlflow=""',  # a profile is no run to track
        "log.wandb=off",
        f"log.every_steps={args.steps}",
        "log.breakdown_every=1",
    ]
    # a profile is a new run of its own (checkpoint.resume=never): refused, before torch loads, in a
    # directory that holds a run
    config, run_dir = prepare_run(args, registry_model=True, forced=tuple(forced), suffix="-profile")
    if is_launcher(args):  # every rank profiles itself into the one run directory
        assert run_dir is not None
        return launch_ranks(args, "profile", str(run_dir), ("--steps", str(args.steps), "--top", str(args.top)))
    with startup_signals("profile"):  # before torch loads: a signal while starting is one line and exit 130
        from gputrain.distributed.context import shutdown_distributed
        from gputrain.run.record import recording_start_up
        from gputrain.train.trainer import Trainer

        try:
            with recording_start_up(run_dir):
                trainer = Trainer.from_config(config, run_dir=run_dir, evaluate=False).setup()  # the step only
            report = trainer.profile(top=args.top)
        finally:
            shutdown_distributed()
    if not trainer.parts.place.dist.is_main:
        return 0  # rank 0 speaks for the job; every rank's files are in the run directory
    _show(report, trainer, run_dir)
    return 0


def _show(report: ProfileReport, trainer: Trainer, run_dir: Path | None) -> None:
    """The top ops, the step time and its split, the advisor's findings, the files written."""
    from rich.table import Table

    from gputrain.observe.console import format_split
    from gputrain.terminal import rich_console

    console = rich_console()
    for title, rows in (
        ("top ops by device time", report.top_device_ops),
        ("top ops by host time", report.top_host_ops),
    ):
        if not rows:
            continue
        on_device = bool(report.top_device_ops)
        table = Table(title=title)
        for column in ("op", "calls", *(("self device",) if on_device else ()), "self host"):
            table.add_column(column, justify="left" if column == "op" else "right")
        for row in rows:
            device = (_fmt_us(row["self_device_us"]),) if on_device else ()
            table.add_row(row["name"][:60], str(row["calls"]), *device, _fmt_us(row["self_host_us"]))
        console.print(table)
    facts = report.facts
    split = report.summary["train"].get("time_breakdown")
    console.print(
        f"step time {1000 * facts.step_time_s:.2f} ms on {trainer.parts.place.device} ({facts.precision})"
        + (f" (rank 0 of {trainer.parts.place.dist.world_size})" if trainer.parts.place.dist.enabled else "")
        + (f"; time split {format_split(split)}" if split else "")
    )
    if report.findings:
        console.print("[bold]findings[/bold]")
        for finding in report.findings:
            console.print(f"  • {finding.bottleneck}: {finding.evidence} → [bold]{finding.change}[/bold]")
    else:
        console.print("findings: none — no bottleneck the advisor knows of")
    for path in report.files:
        console.print(f"wrote {path}")
    if trainer.parts.place.dist.enabled:
        console.print(
            f"ranks 1..{trainer.parts.place.dist.world_size - 1} wrote their own trace-rank<N>.json and "
            f"profile-rank<N>.json into {run_dir}"
        )
