"""`gputrain train`: parse → build the config → Trainer.from_config → fit."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gputrain.cli.launching import add_launch_arguments, is_launcher, launch_ranks, prepare_run, train_here
from gputrain.config.docs import RL_SECTION, fields_help_text

if TYPE_CHECKING:
    from gputrain.train.trainer import Trainer


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
    parser.epilog = fields_help_text(omit=(RL_SECTION,))


def run(args: argparse.Namespace) -> int:
    # the config (a run directory's own, where it holds a run), every path it names and the run
    # directory, before torch loads: a typo answers at once, and before any rank starts
    config, run_dir = prepare_run(args, registry_model=True)
    if is_launcher(args):
        assert run_dir is not None
        return launch_ranks(args, "train", str(run_dir))

    def build() -> Trainer:
        from gputrain.train.trainer import Trainer

        return Trainer.from_config(config, run_dir=run_dir).setup()  # built where a failure is recorded

    return train_here("train", run_dir, build)
