"""`gputrain train`: parse → build the config → Trainer.from_config → fit."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gputrain.cli.launching import add_launch_arguments, is_launcher, launch_ranks
from gputrain.config.docs import fields_help_text

if TYPE_CHECKING:
    from gputrain.config import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file (overrides still apply on top)")
    parser.add_argument("--run-dir", metavar="DIR", help="run directory (default runs/<model>-<data>-<time>/)")
    add_launch_arguments(parser)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="config overrides, values as TOML literals (3, 1e-3, true, [0.9, 0.95]) or strings",
    )
    parser.epilog = fields_help_text()


def run(args: argparse.Namespace) -> int:
    from gputrain.config import load_config
    from gputrain.config.paths import check_config_paths
    from gputrain.train.run_files import check_run_dir

    config = load_config(args.config, args.overrides)
    # every path the config names, and the run directory, before torch loads: a typo answers at once
    check_config_paths(config)
    if is_launcher(args):
        return _launch(args, config)
    if args.run_dir is not None:
        check_run_dir(Path(args.run_dir))
    from gputrain.distributed.context import shutdown_distributed
    from gputrain.train.signals import StoppedBySignal
    from gputrain.train.trainer import Trainer

    trainer = Trainer.from_config(config, run_dir=args.run_dir)
    try:
        summary = trainer.fit()
    except StoppedBySignal as err:
        raise err.for_cli() from None  # the command line's way to resume
    finally:
        shutdown_distributed()
    return 0 if summary["status"] in ("completed", "stopped_early") else 1


def _launch(args: argparse.Namespace, config: Config) -> int:
    """Start the ranks under torchrun with the same command minus the launch options (no recursion)."""
    from gputrain.train.run_files import check_run_dir, default_run_dir

    # one run directory for every rank and every restart, so resume=auto finds the checkpoints
    run_dir = args.run_dir or str(default_run_dir(config.model.name, config.data.name))
    check_run_dir(Path(run_dir))  # before any rank starts
    return launch_ranks(args, "train", run_dir)
