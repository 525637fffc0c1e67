"""The launch options `train` and `profile` share: with --nproc-per-node the command starts
torchrun, which runs the same command (minus these options) once per rank."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_launch_arguments(parser: argparse.ArgumentParser, restarts: bool = True) -> None:
    group = parser.add_argument_group("several processes (starts torchrun; one process per GPU)")
    group.add_argument("--nproc-per-node", type=int, metavar="N", help="processes on this node")
    group.add_argument("--nnodes", type=int, default=1, metavar="M", help="number of nodes (default 1)")
    group.add_argument("--node-rank", type=int, default=0, metavar="R", help="this node's index, 0..M-1")
    group.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address and a free port (M > 1)")
    if restarts:
        group.add_argument(
            "--max-restarts",
            type=int,
            default=0,
            metavar="K",
            help="restart all ranks up to K times when one fails; they resume from the last checkpoint",
        )


def is_launcher(args: argparse.Namespace) -> bool:
    """True in the command the user typed with --nproc-per-node; False in the ranks torchrun starts."""
    return args.nproc_per_node is not None and "WORLD_SIZE" not in os.environ


def launch_ranks(args: argparse.Namespace, command: str, run_dir: str, options: tuple[str, ...] = ()) -> int:
    """Run `gputrain <command>` on every rank with the user's config file and overrides, the
    command's own `options`, and one run directory for all ranks and restarts."""
    from gputrain.distributed.launch import LaunchOptions, launch

    child_argv = [
        command,
        *(["--config", args.config] if args.config else []),
        "--run-dir",
        run_dir,
        *options,
        *args.overrides,
    ]
    opts = LaunchOptions(
        nproc_per_node=args.nproc_per_node,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        max_restarts=getattr(args, "max_restarts", 0),
    )
    return launch(opts, child_argv, Path(run_dir))
