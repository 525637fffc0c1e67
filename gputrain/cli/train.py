"""`gputrain train`: parse → build the config → Trainer.from_config → fit."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from gputrain.cli.launching import add_launch_arguments, is_launcher, launch_ranks, prepare_run, train_here
from gputrain.config.docs import RL_SECTION, fields_help_text

if TYPE_CHECKING:
    from gputrain.config import Config
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
    if config.parallel.strategy == "tuned" and "WORLD_SIZE" not in os.environ:
        config, run_dir = _apply_tune(args, config, run_dir)
    if is_launcher(args):
        assert run_dir is not None
        return launch_ranks(args, "train", str(run_dir))

    def build() -> Trainer:
        from gputrain.train.trainer import Trainer

        return Trainer.from_config(config, run_dir=run_dir).setup()  # built where a failure is recorded

    return train_here("train", run_dir, build)


def _apply_tune(args: argparse.Namespace, config: Config, run_dir: Path | None) -> tuple[Config, Path | None]:
    """parallel.strategy=tuned, in the command the user typed (the ranks get the resolved overrides):
    the tune's winner for this machine and config (gputrain/tune/apply.py), on its ranks unless
    --nproc-per-node says how many; else auto's choice. One line says which and why."""
    from gputrain.env.device import resolve_device
    from gputrain.tune.apply import resolve_tuned
    from gputrain.tune.fingerprint import machine

    device = resolve_device(config.train.device)[0]
    tuned = resolve_tuned(config, machine(device.type), args.nproc_per_node)
    print(tuned.line, flush=True)
    args.overrides = [*args.overrides, *tuned.overrides]
    if args.nproc_per_node is None and tuned.ranks is not None and tuned.ranks > 1:
        args.nproc_per_node = tuned.ranks
    if run_dir is not None and args.run_dir is None:
        args.run_dir = str(run_dir)  # the directory named once: the second reading keeps it
    return prepare_run(args, registry_model=True)
