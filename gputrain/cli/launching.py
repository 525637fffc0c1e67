"""What `train`, `profile` (and `rl`) share: the checks before a run starts, and the launch options:
with --nproc-per-node the command starts torchrun, which runs the same command (minus these options)
once per rank."""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gputrain.distributed.endpoint import DEFAULT_WAIT_S
from gputrain.errors import Interrupted, UsageError
from gputrain.run.layout import SUMMARY

if TYPE_CHECKING:
    from gputrain.config import Config
    from gputrain.config.load import Defaults


class Fits(Protocol):
    """A loop that trains to its end and returns its summary (the Trainer, the PPOTrainer)."""

    def fit(self) -> dict[str, Any]: ...


def whole_number(least: int) -> Callable[[str], int]:
    """argparse type: a whole number >= `least`. Checked as the command line is read, before any
    config check divides by it (rl's envs per rank) or a process is started."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, not {value}")
        return value

    return parse


def _ranks_per_node(text: str) -> int:
    """argparse type of --nproc-per-node: a whole number >= 1 that this node's memory can start."""
    from gputrain.distributed.launch import check_ranks_per_node

    count = whole_number(1)(text)
    try:
        check_ranks_per_node(count)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--nproc-per-node ")) from None
    return count


def add_launch_arguments(parser: argparse.ArgumentParser, restarts: bool = True) -> None:
    group = parser.add_argument_group("several processes (starts torchrun; one process per GPU)")
    group.add_argument("--nproc-per-node", type=_ranks_per_node, metavar="N", help="processes on this node")
    group.add_argument("--nnodes", type=whole_number(1), default=1, metavar="M", help="number of nodes (default 1)")
    group.add_argument("--node-rank", type=whole_number(0), default=0, metavar="R", help="this node's index, 0..M-1")
    group.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="node 0's address and a free port (M > 1)")
    group.add_argument(
        "--rdzv-timeout",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="S",
        help=f"seconds to wait for the endpoint to resolve and answer (node 0 may start later; default "
        f"{DEFAULT_WAIT_S:g})",
    )
    if restarts:
        group.add_argument(
            "--max-restarts",
            type=whole_number(0),
            default=0,
            metavar="K",
            help="restart all ranks up to K times when one fails; they resume from the last checkpoint",
        )


def is_launcher(args: argparse.Namespace) -> bool:
    """True in the command the user typed with --nproc-per-node; False in the ranks torchrun starts."""
    return args.nproc_per_node is not None and "WORLD_SIZE" not in os.environ


def _job_ranks(args: argparse.Namespace) -> int:
    """The processes of the job this command starts (launcher) or belongs to (a rank)."""
    if is_launcher(args):
        return int(args.nproc_per_node) * int(args.nnodes)
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def prepare_run(
    args: argparse.Namespace,
    *,
    registry_model: bool,
    forced: tuple[str, ...] = (),
    suffix: str = "",
    default_name: Callable[[Config], tuple[str, str]] | None = None,
    defaults: Defaults | None = None,
    kind: str = "train",
) -> tuple[Config, Path | None]:
    """The config and run directory of a command that trains, checked before torch loads: the
    config (a run directory's own config.toml where it holds a run, with the overrides and `forced`
    on top), every path it names, the layout a registry model supports (`registry_model`) in a job
    of several ranks, and the run directory (it takes files, its entries are right, a run it holds
    is this one). The directory is the default (named by `default_name(config)` (model, data), else
    the config's model and data, plus `suffix`) where none is given and one process or the launcher
    decides it; None in a rank of a job started without one (the ranks agree on one later).
    `defaults`: the command's own values for shared keys the config leaves unset (config/load.py);
    `kind`: the kind of run the command trains (run/prior.py's KINDS): a directory holding another
    kind's run is refused before its config is read.

    Raises:
        UsageError: naming the field, file or directory.
    """
    from gputrain.config.paths import check_config_paths
    from gputrain.config.validate import check_registry_layout
    from gputrain.run.files import check_run_dir, default_run_dir, run_dir_path
    from gputrain.run.prior import check_resume_never, check_run_kind, check_same_run, load_run_config, prior_run

    run_dir = run_dir_path(args.run_dir) if args.run_dir is not None else None
    if run_dir is not None:
        check_run_kind(run_dir, prior_run(run_dir), kind)  # its config is another command's
    config = load_run_config(run_dir, args.config, [*args.overrides, *forced], defaults)
    check_config_paths(config)
    ranks = _job_ranks(args)
    if registry_model and ranks > 1:
        check_registry_layout(config)
    if run_dir is None and (is_launcher(args) or ranks == 1):
        model, data = default_name(config) if default_name else (config.model.name, config.data.name)
        run_dir = Path(f"{default_run_dir(model, data)}{suffix}")
    if run_dir is not None:
        check_run_dir(run_dir)
        prior = prior_run(run_dir)
        check_same_run(run_dir, config, prior, defaults, kind)
        check_resume_never(run_dir, prior, config.checkpoint.resume)
    return config, run_dir


def train_here(command: str, run_dir: Path | None, build: Callable[[], Fits]) -> int:
    """Train in this process (one process, or a rank of a job): a signal while it starts is one line
    and exit 130, a failure in `build` (which imports the heavy modules itself, so the signals are
    armed first) is recorded, and a stop by a signal names `gputrain <command>` to resume.

    Returns:
        0 where the run completed, stopped early or spent its train.max_time (saved, to continue), else 1.
    """
    from gputrain.interrupts import startup_signals
    from gputrain.run.prior import COMPLETE

    with startup_signals(command):  # before torch loads
        from gputrain.distributed.context import shutdown_distributed
        from gputrain.run.record import recording_start_up
        from gputrain.run.signals import StoppedBySignal

        try:
            with recording_start_up(run_dir):
                trainer = build()
            summary = trainer.fit()
        except StoppedBySignal as err:
            raise err.for_cli(command) from None  # the command line's way to resume
        finally:
            shutdown_distributed()
    return 0 if summary["status"] in (*COMPLETE, "timed_out") else 1


def launch_ranks(args: argparse.Namespace, command: str, run_dir: str, options: tuple[str, ...] = ()) -> int:
    """Run `gputrain <command>` on every rank with the user's config file and overrides, the
    command's own `options`, and one run directory for all ranks and restarts."""
    from gputrain.interrupts import startup_signals

    with startup_signals(command):  # until torchrun's agent takes the signals: one line and exit 130, not 143
        return _launch(args, command, run_dir, options)


def _launch(args: argparse.Namespace, command: str, run_dir: str, options: tuple[str, ...]) -> int:
    from gputrain.distributed.endpoint import RendezvousFailed
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
        rdzv_timeout_s=args.rdzv_timeout,
    )
    # the launch options and the endpoint, before torchrun starts: a UsageError from `launch` is the
    # ranks' (rank 0 printed it), so these would go unsaid there
    opts.check()
    opts.check_rendezvous()
    _quiet_torchrun()
    began = time.time() - 1.0  # file-system timestamps may be coarse
    try:
        return launch(opts, child_argv, Path(run_dir))
    except RendezvousFailed:
        raise  # the launcher's own line: no rank started
    except UsageError:
        # every rank refused the input: rank 0 has printed that one line; the launcher adds none
        raise UsageError("every rank refused the input", shown=True) from None
    except Interrupted:
        if not _recorded_since(Path(run_dir), began):
            # the ranks were still starting: rank 0 said so, no checkpoint
            raise Interrupted("interrupted while the ranks started", shown=True) from None
        raise


def _recorded_since(run_dir: Path, began: float) -> bool:
    """Whether the ranks wrote a summary in this launch (a run that began, then stopped)."""
    try:
        return (run_dir / SUMMARY).stat().st_mtime >= began
    except OSError:
        return False


_AGENT_LINES = (
    "Sending process %s closing signal %s",  # torchrun stopping the other ranks once one failed
    "failed (exitcode: %s)",  # a rank's exit status, which the launcher names itself
    "Received %s death signal, shutting down workers",  # a signal the launcher reports itself
)


class _AgentNoise(logging.Filter):
    """Drops torchrun's lines about stopping ranks: the launcher says in one line which rank failed
    first and how (distributed/launch.py), after the rank's own message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(str(record.msg).startswith(line) for line in _AGENT_LINES)


def _quiet_torchrun() -> None:
    for name in ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _AgentNoise) for f in logger.filters):
            logger.addFilter(_AgentNoise())
