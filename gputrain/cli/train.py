"""`gputrain train`: parse → build the config → Trainer.from_config → fit."""

from __future__ import annotations

import argparse
import os

from gputrain.config.docs import fields_help_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="TOML config file (overrides still apply on top)")
    parser.add_argument("--run-dir", metavar="DIR", help="run directory (default runs/<model>-<data>-<time>/)")
    launch = parser.add_argument_group("several processes (starts torchrun; one process per GPU)")
    launch.add_argument("--nproc-per-node", type=int, metavar="N", help="processes on this node")
    launch.add_argument("--nnodes", type=int, default=1, metavar="M", help="number of nodes (default 1)")
    launch.add_argument("--node-rank", type=int, default=0, metavar="R", help="this node's index, 0..M-1")
    launch.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address and a free port (M > 1)")
    launch.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="restart all ranks up to K times when one fails; they resume from the last checkpoint")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="config overrides, values as TOML literals (3, 1e-3, true, [0.9, 0.95]) or strings")
    parser.epilog = fields_help_text()


def run(args: argparse.Namespace) -> int:
    from gputrain.config import load_config
    from gputrain.train.trainer import Trainer

    config = load_config(args.config, args.overrides)
    if args.nproc_per_node is not None and "WORLD_SIZE" not in os.environ:  # the launcher, not a rank
        return _launch(args, config)
    from gputrain.distributed import shutdown_distributed

    trainer = Trainer.from_config(config, run_dir=args.run_dir)
    try:
        summary = trainer.fit()
    finally:
        shutdown_distributed()
    return 0 if summary["status"] in ("completed", "stopped_early") else 1


def _launch(args: argparse.Namespace, config: object) -> int:
    """Start the ranks under torchrun with the same command minus the launch options (no recursion)."""
    from gputrain.distributed.launch import LaunchOptions, launch
    from gputrain.train.run_files import default_run_dir

    # one run directory for every rank and every restart, so resume=auto finds the checkpoints
    run_dir = args.run_dir or str(default_run_dir(config.model.name, config.data.name))  # type: ignore[attr-defined]
    child = ["train", *(["--config", args.config] if args.config else []), "--run-dir", run_dir, *args.overrides]
    opts = LaunchOptions(nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                         rdzv_endpoint=args.rdzv_endpoint, max_restarts=args.max_restarts)
    from pathlib import Path

    return launch(opts, child, Path(run_dir))
