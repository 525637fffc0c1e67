"""The `gputrain` command: one module per subcommand, imported only when that subcommand runs.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`. Errors derived
from `GputrainError` are printed as one short message with their exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gputrain.errors import GputrainError

# name -> (module, one-line help). Modules are imported lazily so `gputrain doctor` does not pay
# for the training stack, and a broken optional piece cannot break the other subcommands.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("gputrain.cli.train", "train a model (one device, or torchrun for many)"),
    "config": ("gputrain.cli.config_cmd", "show the config fields, their defaults and meanings"),
    "doctor": ("gputrain.cli.doctor", "can this machine train on its GPUs? if not, why and how to fix it"),
    "bench": ("gputrain.cli.bench", "microbenchmarks: matmul FLOP/s per dtype, memory, transfers, all-reduce"),
}


def register_subcommand(name: str, module: str, help_text: str) -> None:
    """Add a subcommand (used by the subcommand tables of other parts of the package)."""
    SUBCOMMANDS[name] = (module, help_text)


def _build_parser(name: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gputrain",
        description="Train neural networks fast on GPUs: doctor → bench → train → profile → report.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd, (module_name, help_text) in SUBCOMMANDS.items():
        cmd_parser = sub.add_parser(cmd, help=help_text, description=help_text,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        if cmd == name:  # only the chosen subcommand's module is imported
            importlib.import_module(module_name).add_arguments(cmd_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    name = args_list[0] if args_list and args_list[0] in SUBCOMMANDS else None
    parser = _build_parser(name)
    if name is None:
        if args_list and not args_list[0].startswith("-"):
            parser.error(f"unknown command {args_list[0]!r}; choose from {', '.join(SUBCOMMANDS)}")
        parser.print_help()
        return 0 if args_list else 2
    args = parser.parse_args(args_list)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.run(args) or 0)
    except GputrainError as err:
        print(f"gputrain {name}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"gputrain {name}: interrupted", file=sys.stderr)
        return 130
