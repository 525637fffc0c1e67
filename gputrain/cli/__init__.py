"""The `gputrain` command: one module per subcommand, imported only when that subcommand runs.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`. Errors derived
from `GputrainError` are printed as one short message with their exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from gputrain.errors import GputrainError, Interrupted

# name -> (module, one-line help). Modules are imported lazily so `gputrain doctor` does not pay
# for the training stack, and a broken optional piece cannot break the other subcommands.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("gputrain.cli.doctor", "can this machine train on its GPUs? if not, why and how to fix it"),
    "bench": ("gputrain.cli.bench", "microbenchmarks: matmul FLOP/s per dtype, memory, transfers, all-reduce"),
    "train": ("gputrain.cli.train", "train a model (one device, or torchrun for many)"),
    "profile": ("gputrain.cli.profile", "profile a short training: top ops, trace, and what to change"),
    "config": ("gputrain.cli.config_cmd", "show the config fields, their defaults and meanings"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage block can run to many lines; --help has it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gputrain",
        description="Train neural networks fast on GPUs: doctor → bench → train → profile → report.",
    )
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


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in SUBCOMMANDS:
        parser = _top_parser()
        if args_list and args_list[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        if args_list:
            parser.error(f"unknown command {args_list[0]!r}; choose from {', '.join(SUBCOMMANDS)}")
        parser.print_help()
        return 2
    name = args_list[0]
    # intermixed: options may come before, between or after the section.key=value overrides
    args = _command_parser(name).parse_intermixed_args(args_list[1:])
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.run(args) or 0)
    except GputrainError as err:
        # an interrupted multi-rank job: rank 0 (and the launcher) say so once, not every rank
        if not (isinstance(err, Interrupted) and os.environ.get("RANK", "0") != "0"):
            print(f"gputrain {name}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"gputrain {name}: interrupted", file=sys.stderr)
        return 130
