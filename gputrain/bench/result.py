"""One benchmark figure, and the settings that size and repeat the benchmarks."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["BenchResult", "Mode", "Settings", "settings_for"]

Mode = Literal["full", "quick", "tiny"]
# Test hook: GPUTRAIN_BENCH_TINY=1 shrinks every size so the real command runs in a few seconds.
TINY_ENV = "GPUTRAIN_BENCH_TINY"


@dataclass(frozen=True)
class BenchResult:
    """One figure, in base units: FLOP/s, B/s, or x for a ratio."""

    bench: str
    device: str
    dtype: str
    size: str
    value: float
    unit: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Settings:
    """Sizes and repeat counts for one mode on one kind of device."""

    mode: Mode
    matmul_n: int
    conv_batch: int
    conv_channels: int
    conv_hw: int
    copy_bytes: int
    transfer_bytes: int
    allreduce_bytes: int
    warmup: int
    repeats: int
    budget_s: float
    """Seconds of timed repeats each figure may take (the warm-up decides how many fit)."""
    warmup_s: float
    """Seconds each figure warms up at least (CPU clocks and thread pools ramp up)."""

    def timing_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `gputrain.bench.timing.measure` for these settings."""
        return {
            "warmup": self.warmup,
            "repeats": self.repeats,
            "budget_s": self.budget_s,
            "min_warmup_s": self.warmup_s,
        }


MIB = 1 << 20
# GPU sizes fill the device: an 8192² matmul keeps every SM busy, a 1 GiB copy dwarfs the L2.
# CPU sizes are large enough to run all cores at full speed, small enough for a 2-core laptop.
_SETTINGS: dict[tuple[str, Mode], Settings] = {
    ("cuda", "full"): Settings("full", 8192, 64, 128, 56, 1024 * MIB, 256 * MIB, 256 * MIB, 3, 20, 2.0, 0.2),
    ("cuda", "quick"): Settings("quick", 4096, 32, 128, 56, 512 * MIB, 64 * MIB, 64 * MIB, 2, 10, 0.5, 0.1),
    ("cpu", "full"): Settings("full", 2048, 16, 64, 56, 512 * MIB, 0, 16 * MIB, 2, 10, 3.0, 1.0),
    ("cpu", "quick"): Settings("quick", 1024, 4, 64, 56, 128 * MIB, 0, 4 * MIB, 1, 5, 1.0, 0.75),
    ("any", "tiny"): Settings("tiny", 128, 1, 8, 16, 4 * MIB, 4 * MIB, 1 * MIB, 1, 3, 0.1, 0.0),
}


def settings_for(device_type: str, quick: bool) -> Settings:
    """The settings for `device_type` ("cuda" or "cpu"), honouring the tiny test mode."""
    if os.environ.get(TINY_ENV) == "1":
        return _SETTINGS[("any", "tiny")]
    return _SETTINGS[("cuda" if device_type == "cuda" else "cpu", "quick" if quick else "full")]
