"""The bounds on what the `use` commands are asked to do, named once and checked before any work
starts: generate's tokens, samples, temperature and seed; bench-infer's batch sizes and repeats.
Imports nothing heavy: the CLI checks its options before torch is loaded.

Each check raises UsageError naming the option, the value and the range; `argparse_type` turns one
into an option's type, so the command line and the library (use/generate.py's Sampling) refuse the
same values in the same words.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from gputrain.errors import UsageError

MAX_NEW_TOKENS = 100_000
"""generate: new tokens per sample. Past the context each one costs a full-window pass."""
MAX_NUM_SAMPLES = 1_024
"""generate: samples drawn side by side (one batch)."""
MAX_TOKENS_HELD = 10_000_000
"""generate: new tokens in all (samples x new tokens), held until several samples are printed."""
MIN_TEMPERATURE = 1e-4
"""generate: the smallest temperature other than 0 (greedy). Below it sampling is greedy in all but
name, and the logits divided by a tiny one (a denormal such as 5e-324) overflow to infinity."""
MAX_TEMPERATURE = 100.0
"""generate: the largest temperature; at 100 the tokens are already drawn all but uniformly."""
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
"""What torch's generator takes as a seed (a negative seed is taken modulo 2**64)."""
MAX_BENCH_BATCH = 8_192
"""bench-infer: the largest batch size timed (its inputs are held on each device)."""
MAX_BENCH_SIZES = 16
"""bench-infer: batch sizes in one --batch list (each is timed in every mode on every device)."""
MAX_BENCH_REPEATS = 100_000
"""bench-infer: timed calls per batch size (a time budget per mode cuts them short on a slow machine)."""

T = TypeVar("T")


def whole(option: str, text: str) -> int:
    """`text` as a whole number, or UsageError naming `option`."""
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: not a whole number") from None


def check_range(option: str, value: int, low: int, high: int, name: str = "") -> int:
    """`value`, or UsageError where it is outside low..high (`name`: the constant that sets `high`)."""
    if not low <= value <= high:
        limit = f" ({name})" if name else ""
        raise UsageError(f"{option} {value}: outside {low:,}..{high:,}{limit}")
    return value


def check_new_tokens(value: int) -> int:
    return check_range("--max-new-tokens", value, 1, MAX_NEW_TOKENS, "MAX_NEW_TOKENS")


def check_num_samples(value: int) -> int:
    return check_range("--num-samples", value, 1, MAX_NUM_SAMPLES, "MAX_NUM_SAMPLES")


def check_tokens_held(max_new_tokens: int, num_samples: int) -> None:
    """Several samples are printed once all are drawn: their tokens are held until then."""
    if num_samples > 1 and max_new_tokens * num_samples > MAX_TOKENS_HELD:
        raise UsageError(
            f"--num-samples {num_samples} x --max-new-tokens {max_new_tokens} = {max_new_tokens * num_samples:,} "
            f"tokens to hold; at most {MAX_TOKENS_HELD:,} (MAX_TOKENS_HELD): draw fewer samples, or fewer tokens each"
        )


def check_seed(value: int) -> int:
    if not SEED_MIN <= value <= SEED_MAX:
        raise UsageError(f"--seed {value}: outside -2**63..2**64-1, the seeds torch's generator takes")
    return value


def check_temperature(value: float) -> float:
    """0 (greedy), or a finite number in MIN_TEMPERATURE..MAX_TEMPERATURE."""
    if value == 0 or MIN_TEMPERATURE <= value <= MAX_TEMPERATURE:  # NaN compares False: refused
        return float(value)
    raise UsageError(
        f"--temperature {value}: give 0 (greedy: always the most likely token) or a number from "
        f"{MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}"
    )


def temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--temperature {text!r}: not a number") from None
    return check_temperature(value)


def seed(text: str) -> int:
    return check_seed(whole("--seed", text))


def new_tokens(text: str) -> int:
    return check_new_tokens(whole("--max-new-tokens", text))


def num_samples(text: str) -> int:
    return check_num_samples(whole("--num-samples", text))


def bench_repeats(text: str) -> int:
    return check_range("--repeats", whole("--repeats", text), 1, MAX_BENCH_REPEATS, "MAX_BENCH_REPEATS")


def bench_batches(text: str) -> tuple[int, ...]:
    """--batch 1,32: distinct batch sizes, sorted."""
    try:
        values = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise UsageError(f"--batch {text!r}: give batch sizes as 1,32") from None
    if not values:
        raise UsageError(f"--batch {text!r}: give batch sizes as 1,32")
    if len(values) > MAX_BENCH_SIZES:
        raise UsageError(f"--batch: {len(values)} batch sizes; at most {MAX_BENCH_SIZES} (MAX_BENCH_SIZES)")
    for value in (values[0], values[-1]):
        check_range("--batch", value, 1, MAX_BENCH_BATCH, "MAX_BENCH_BATCH")
    return values


def argparse_type(check: Callable[[str], T]) -> Callable[[str], T]:
    """`check` as an option's type: its refusal becomes argparse's one-line usage error (exit 2)."""

    def parse(text: str) -> T:
        try:
            return check(text)
        except UsageError as err:
            # argparse names the option itself: the message from the value on
            message = str(err)
            raise argparse.ArgumentTypeError(message.split(" ", 1)[1] if message.startswith("-") else message) from None

    parse.__name__ = check.__name__  # argparse names the type in "invalid <name> value" messages
    return parse
