"""`gputrain train`: parse → build the config → Trainer.from_config → fit."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gputrain.cli.launching import add_launch_arguments, is_launcher, launch_ranks, prepare_run
from gputrain.config.docs import fields_help_text

if TYPE_CHECKING:
    from gputrain.config import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file (overrides still apply on top)")
    parser.add_argument(
        "--run-dir",
        metavar="DIR",
        help="run directory (default runs/<model>-<data>-<time>/); one that holds a run continues it with "
        "its own config.toml (overrides apply on top of it)",
    )
    add_launch_arguments(parser)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="section.key=value",
        help="config overrides, values as TOML literals (3, 1e-3, true, [0.9, 0.95]) or strings",
    )
    parser.epilog = fields_help_text()


def run(args: argparse.Namespace) -> int:
    # the config (a run directory's own, where it holds a run), every path it names and the run
    # directory, before torch loads: a typo answers at once, and before any rank starts
    config, run_dir = prepare_run(args, registry_model=True)
    if is_launcher(args):
        assert run_dir is not None
        return launch_ranks(args, "train", str(run_dir))
    return _train(config, run_dir)


def _train(config: Config, run_dir: Path | None) -> int:
    from gputrain.interrupts import startup_signals

    with startup_signals("train"):  # before torch loads: a signal while starting is one line and exit 130
        from gputrain.distributed.context import shutdown_distributed
        from gputrain.train.run_record import recording_start_up
        from gputrain.train.signals import StoppedBySignal
        from gputrain.train.trainer import Trainer

        try:
            with recording_start_up(run_dir):
                trainer = Trainer.from_config(config, run_dir=run_dir)
            summary = trainer.fit()
        except StoppedBySignal as err:
            raise err.for_cli("train") from None  # the command line's way to resume
        finally:
            shutdown_distributed()
    return 0 if summary["status"] in ("completed", "stopped_early") else 1
