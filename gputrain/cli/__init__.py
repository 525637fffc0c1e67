"""The `gputrain` command: one module per subcommand, imported only when that subcommand runs.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`. Errors derived
from `GputrainError` are printed as one short message with their exit code, never a traceback.
A subcommand that takes a config (`--config` and overrides) has it checked here before its module
runs, so a bad value answers in a fraction of a second, before torch is imported or ranks start.
Under torchrun (or srun) every rank checks the same command line: a usage error is printed by rank
0 only, and every rank exits 2.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import NoReturn

from gputrain import __version__
from gputrain.errors import GputrainError, Interrupted, UsageError
from gputrain.interrupts import (
    RUN_COMMANDS,
    StoppedAtOnce,
    check_sighup_choice,
    end_of_the_start,
    guard_the_start,
    job_rank,
)
from gputrain.pipes import STDOUT_CLOSED_EXIT, closed_stdout, stdout_closed
from gputrain.run.fs_errors import check_working_directory
from gputrain.terminal import printable

# name -> (module, one-line help). Modules are imported lazily so `gputrain doctor` does not pay
# for the training stack, and a broken optional piece cannot break the other subcommands.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("gputrain.cli.doctor", "what can this machine train on? its GPUs, or why not and the fix"),
    "bench": ("gputrain.cli.bench", "microbenchmarks: matmul FLOP/s per dtype, memory, transfers, all-reduce"),
    "train": ("gputrain.cli.train", "train a model (one device, or torchrun for many)"),
    "plan": ("gputrain.cli.plan", "will it fit? memory per device for each strategy, what auto picks, the batch"),
    "tune": ("gputrain.cli.tune", "which layout that fits is fastest, measured: for parallel.strategy=tuned"),
    "profile": ("gputrain.cli.profile", "profile a short training: top ops, trace, and what to change"),
    "config": ("gputrain.cli.config_cmd", "show the config fields, their defaults and meanings"),
    "report": ("gputrain.cli.report", "one self-contained HTML file of a run (curves, speed, ROC), or runs compared"),
    "lr-find": ("gputrain.cli.lr_find", "a learning-rate range test: the suggested optim.lr and its curve"),
    "evaluate": ("gputrain.cli.evaluate", "evaluate a run's model on a split or new data"),
    "predict": ("gputrain.cli.predict", "a run's model on new inputs: CSV rows or images in, predictions out"),
    "generate": ("gputrain.cli.generate", "sample text from a run's language model"),
    "export": ("gputrain.cli.export", "export a run's model (safetensors, torch.export, ONNX), verified"),
    "bench-infer": ("gputrain.cli.bench_infer", "inference latency and throughput: eager, compiled, exported, ONNX"),
    "prepare": ("gputrain.cli.prepare", "a corpus into token shards and a manifest for data.name=tokens (resumable)"),
    "rl": ("gputrain.cli.rl", "reinforcement learning: PPO on environments stepped as tensors"),
    "sweep": ("gputrain.cli.sweep", "a hyperparameter search over Optuna: trials are runs, the study is shared"),
    "sweep-trial": ("gputrain.cli.sweep_trial", "one trial of a sweep (`gputrain sweep` starts it)"),
}


QUIET_RANK_WAIT_S = 3.0
"""How long a rank other than 0 keeps a usage error to itself (see `_wait_for_rank_0`)."""


def _wait_for_rank_0(exit_code: int) -> None:
    """On a rank other than 0 that met a usage error: give rank 0 the time to report it.

    Every rank reads the same command line and config, so rank 0 meets the same error, prints it
    and exits; torchrun then stops the other ranks with SIGTERM, on which this rank exits with
    the same code, silently. Waiting also keeps this rank from exiting first, which would make
    torchrun stop rank 0 before it printed. Returns only when nothing stopped this rank within
    QUIET_RANK_WAIT_S: then the error is its own (a file only its node lacks), and it says so.
    """
    previous = signal.signal(signal.SIGTERM, lambda *_: os._exit(exit_code))
    try:
        time.sleep(QUIET_RANK_WAIT_S)
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: rank 0 speaks for them
        os._exit(exit_code)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _say(text: str, exit_code: int = 2) -> None:
    """Print a usage error once per job: on rank 0, or on a rank whose error is its own."""
    rank = job_rank()
    if rank != 0:
        _wait_for_rank_0(exit_code)
        text = f"[rank {rank}] {text}"
    print(printable(text), file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage block can run to many lines; --help has it)."""

    def error(self, message: str) -> NoReturn:
        _say(f"{self.prog}: error: {message} (see {self.prog} --help)")
        self.exit(2)


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gputrain",
        description="Train neural networks fast on GPUs: doctor → bench → train → profile → report.",
    )
    parser.add_argument("-V", "--version", action="version", version=f"gputrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(cmd, help=help_text)
    return parser


def _command_parser(name: str) -> argparse.ArgumentParser:
    help_text = SUBCOMMANDS[name][1]
    parser = _Parser(
        prog=f"gputrain {name}", description=help_text, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    importlib.import_module(SUBCOMMANDS[name][0]).add_arguments(parser)
    return parser


def _check_config(args: argparse.Namespace) -> None:
    """Load (and so validate) the config of a subcommand that takes one, before the subcommand runs.

    Raises:
        UsageError: the config file or an override is bad (ConfigError names the field).
    """
    if hasattr(args, "config") and hasattr(args, "overrides"):
        if args.config is None and getattr(args, "run_dir", None):
            # the overrides may go on top of the run directory's own config.toml, not the defaults
            # (`gputrain rl --run-dir DIR rl.total_timesteps=N` of a run with a smaller rollout than
            # the defaults'): the command loads and checks that, before torch loads (run/prior.py)
            return
        from gputrain.config import load_config

        load_config(args.config, args.overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in SUBCOMMANDS:
        parser = _top_parser()
        if args_list and args_list[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        if args_list and args_list[0] in ("-V", "--version"):
            print(f"gputrain {__version__}")
            return 0
        if args_list:
            parser.error(f"unknown command {args_list[0]!r}; choose from {', '.join(SUBCOMMANDS)}")
        parser.print_help()
        return 2
    name = args_list[0]
    # intermixed: options may come before, between or after the section.key=value overrides
    args = _command_parser(name).parse_intermixed_args(args_list[1:])
    try:
        check_working_directory()  # deleted under the shell: torch's libraries would fail to load on it
        check_sighup_choice()
        _check_config(args)
        module = importlib.import_module(SUBCOMMANDS[name][0])
        from gputrain.run.files import command_line_words

        if name not in RUN_COMMANDS:  # a run's start-up guard stays until the run arms its own handler
            end_of_the_start()
        with command_line_words():  # messages say --run-dir, not Python's run_dir=
            return int(module.run(args) or 0)
    except GputrainError as err:
        # Rank 0 (and the launcher) speak for a multi-rank job when every rank meets the same
        # error: bad usage (each rank read the same command line) or an interrupt.
        if err.shown:
            return err.exit_code  # said already (by the ranks of a job the launcher started)
        if isinstance(err, UsageError):  # one line: a hint on its own line joins the message
            _say(f"gputrain {name}: " + "; ".join(filter(None, map(str.strip, str(err).splitlines()))), err.exit_code)
        elif job_rank() == 0 or not isinstance(err, Interrupted):
            print(printable(f"gputrain {name}: {err}"), file=sys.stderr)
        return err.exit_code
    except StoppedAtOnce as stop:
        if job_rank() == 0:  # every rank of a job met the same signal: rank 0 speaks for them
            print(f"gputrain {name}: {_stopped_at_once(name, stop.signal_name)}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"gputrain {name}: interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        if closed_stdout(err):  # `gputrain predict ... | head -1`: ended quietly, as a Unix tool is
            return stdout_closed()
        raise


def _stopped_at_once(command: str, signal_name: str) -> str:
    if command in RUN_COMMANDS:  # SIGQUIT: no checkpoint now, summary.json says so
        return f"stopped by {signal_name} at once (the last checkpoint stands: run the same command again to resume)"
    return f"stopped by {signal_name} (run the command again)"


def entry() -> NoReturn:
    """The process's entry (`gputrain`, `python -m gputrain`): the start-up's signal guard first
    (gputrain.interrupts.guard_the_start), `main`, then exit without tearing the interpreter down.
    Freeing every module and object of torch, tensorboard and their imports one by one took 0.5-2 s
    of CPU after a run had finished; the OS frees the process at once. What a normal
    exit does first still runs: the exit handlers (logging's flush, multiprocessing's clean-up of
    worker processes, torch's) and a flush of stdout and stderr. Only once torch is loaded (a usage
    error exits as usual, having nothing heavy to free) and where no other thread runs, since nothing
    would join it; gputrain's files are closed by the time `main` returns.
    """
    guard_the_start()  # first: a signal while the command starts is one line and exit 130
    code = main()
    try:
        sys.stdout.flush()  # what is still buffered, while a closed pipe can still be told apart
    except OSError as err:
        if not closed_stdout(err):
            raise
        code = STDOUT_CLOSED_EXIT if code == 0 else code
        stdout_closed()
    if "torch" in sys.modules and threading.active_count() == 1:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken pipe changes nothing now
                stream.flush()
        os._exit(code)
    raise SystemExit(code)
