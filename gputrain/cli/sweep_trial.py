"""`gputrain sweep-trial`: one trial of `gputrain sweep`, which starts it: `gputrain train` with a
callback that reports the validation metric to the study and stops the run when it is pruned
(sweep/pruning.py). The study's storage comes in the environment (GPUTRAIN_SWEEP_STORAGE)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gputrain.cli.launching import add_launch_arguments, is_launcher, launch_ranks, prepare_run, train_here

if TYPE_CHECKING:
    from gputrain.train.trainer import Trainer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file (overrides still apply on top)")
    parser.add_argument("--run-dir", required=True, metavar="DIR", help="the trial's run directory")
    parser.add_argument("--study", required=True, metavar="NAME", help="the study's name")
    parser.add_argument("--trial-id", required=True, type=int, metavar="ID", help="the trial's id in the storage")
    add_launch_arguments(parser)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")


def run(args: argparse.Namespace) -> int:
    from gputrain.sweep.pruning import storage_url

    storage_url()  # started by `gputrain sweep`, or says so
    config, run_dir = prepare_run(args, registry_model=True)
    if is_launcher(args):
        assert run_dir is not None
        options = ("--study", args.study, "--trial-id", str(args.trial_id))
        return launch_ranks(args, "sweep-trial", str(run_dir), options)

    def build() -> Trainer:
        from gputrain.sweep.pruning import ReportToStudy
        from gputrain.train.trainer import Trainer

        report = ReportToStudy(args.study, args.trial_id)
        return Trainer.from_config(config, run_dir=run_dir, callbacks=[report]).setup()

    return train_here("sweep-trial", run_dir, build)
