"""Command-line options the `use` subcommands share. Imports nothing heavy: the CLI answers
--help and usage errors before torch is loaded."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from gputrain.errors import ConfigError, UsageError

if TYPE_CHECKING:
    import torch

CHECKPOINT_HELP = (
    "which weights: final (default: model.safetensors, the weights the run's test metrics describe; "
    "an unfinished run's last checkpoint), best (the best validation step's checkpoint), last (the newest "
    "checkpoint), or a checkpoint directory / .safetensors file"
)
DEVICES = "auto (a GPU where there is one), cpu, cuda, cuda:N or mps"


def add_run_arguments(parser: argparse.ArgumentParser, device: bool = True) -> None:
    """RUN_DIR, --checkpoint and (with `device`) --device."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory gputrain train wrote")
    parser.add_argument("--checkpoint", default="final", metavar="final|best|last|PATH", help=CHECKPOINT_HELP)
    if device:
        parser.add_argument("--device", default="auto", help=f"{DEVICES} (default auto)")


def use_device(text: str) -> torch.device:
    """The device `--device text` names, checked to be on this machine: every `use` command's
    --device goes through here (training's resolve_device, its refusal reworded for the option).

    Raises:
        UsageError: one line naming the option, what is wrong, and the choices.
    """
    from gputrain.env.device import resolve_device  # imports torch: only once a command runs

    try:
        return resolve_device(text)[0]
    except ConfigError as err:
        raise UsageError(f"--device {text}: {err.problem}; choose from {DEVICES}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def non_negative_float(text: str, meaning: str = "") -> float:
    """argparse type: a finite number >= 0; `meaning` (what 0 means, say) joins the error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be a finite number >= 0" + (f" ({meaning})" if meaning else ""))
    return value
