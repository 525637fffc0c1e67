"""`gputrain train`: parse → build the config → Trainer.from_config → fit."""

from __future__ import annotations

import argparse

from gputrain.config.docs import fields_help_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file (overrides still apply on top)")
    parser.add_argument("--run-dir", metavar="DIR", help="run directory (default runs/<model>-<data>-<time>/)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="config overrides, values as TOML literals (3, 1e-3, true, [0.9, 0.95]) or strings")
    parser.epilog = fields_help_text()


def run(args: argparse.Namespace) -> int:
    from gputrain.config import load_config
    from gputrain.train.trainer import Trainer

    config = load_config(args.config, args.overrides)
    trainer = Trainer.from_config(config, run_dir=args.run_dir)
    summary = trainer.fit()
    return 0 if summary["status"] in ("completed", "stopped_early") else 1
