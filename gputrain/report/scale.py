"""Axes: the data range an axis shows, where its ticks go, and how their numbers read."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def format_number(value: float) -> str:
    """A tick or table number in at most ~5 characters where it can: 0.25, 1.5k, 3M, 2e-05."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = abs(value)
    if magnitude >= 1e4:
        for factor, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if magnitude >= factor:
                return f"{value / factor:.3g}{suffix}"
    if magnitude < 1e-3:
        mantissa, exponent = f"{value:.2e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.4g}"


@dataclass(frozen=True, slots=True)
class Scale:
    """Maps data values onto pixels along one axis (log10 of them where `log`)."""

    low: float
    high: float
    pixel_low: float
    pixel_high: float
    log: bool = False
    integer: bool = False
    """Ticks at whole numbers only (steps)."""

    def _t(self, value: float) -> float:
        return math.log10(value) if self.log else value

    def __call__(self, value: float) -> float:
        lo, hi = self._t(self.low), self._t(self.high)
        share = (self._t(value) - lo) / (hi - lo) if hi != lo else 0.5
        return self.pixel_low + share * (self.pixel_high - self.pixel_low)

    def pixels(self, values: np.ndarray) -> np.ndarray:
        """`self(value)` for an array; non-finite values (and, on a log axis, values <= 0) give NaN."""
        values = np.asarray(values, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(values > 0, np.log10(np.where(values > 0, values, 1.0)), np.nan) if self.log else values
        lo, hi = self._t(self.low), self._t(self.high)
        share = (t - lo) / (hi - lo) if hi != lo else np.full_like(t, 0.5)
        return self.pixel_low + share * (self.pixel_high - self.pixel_low)

    def ticks(self) -> list[float]:
        return log_ticks(self.low, self.high) if self.log else linear_ticks(self.low, self.high, integer=self.integer)


def nice_step(span: float, target: int = 5) -> float:
    """A tick spacing of 1, 2 or 5 times a power of ten giving about `target` ticks over `span`."""
    raw = span / max(target, 1)
    power = 10 ** math.floor(math.log10(raw))
    for multiple in (1, 2, 5, 10):
        if raw <= multiple * power:
            return multiple * power
    return 10 * power


def linear_ticks(low: float, high: float, target: int = 5, integer: bool = False) -> list[float]:
    if high <= low:
        return [low]
    step = nice_step(high - low, target)
    step = max(step, 1.0) if integer else step
    first = math.ceil(low / step - 1e-9) * step
    count = math.floor((high - first) / step + 1e-9) + 1
    return [round(first + i * step, 12) for i in range(count)]


def log_ticks(low: float, high: float) -> list[float]:
    """Powers of ten inside [low, high]; with fewer than three of them, 2× and 5× as well, and with
    none, plain linear ticks (a log axis spanning less than a decade)."""
    first, last = math.ceil(math.log10(low) - 1e-9), math.floor(math.log10(high) + 1e-9)
    decades = list(range(first, last + 1))
    step = max(1, math.ceil(len(decades) / 6))
    ticks = [10.0**d for d in decades[::step]]
    if len(decades) < 3:
        ticks = sorted(
            t * m for t in [10.0**d for d in range(first - 1, last + 1)] for m in (1, 2, 5) if low <= t * m <= high
        )
    return ticks if len(ticks) >= 2 else linear_ticks(low, high, 4)


def data_range(values: np.ndarray, log: bool, include_zero: bool = False) -> tuple[float, float]:
    """The range an axis shows for `values`: all finite ones (positive ones on a log axis), with a
    little room, and zero where asked (rates and norms read best from zero)."""
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values) & ((values > 0) if log else True)]
    if finite.size == 0:
        return (1.0, 10.0) if log else (0.0, 1.0)
    low, high = float(finite.min()), float(finite.max())
    if log:
        if high / low < 1.5:
            return low / 1.25, high * 1.25
        return low / 1.1, high * 1.1
    if include_zero and low > 0:
        low = 0.0
    if high == low:
        pad = abs(high) * 0.1 or 1.0
        return low - pad, high + pad
    pad = (high - low) * 0.04
    return (low if low == 0 else low - pad), high + pad


def wants_log(values: np.ndarray) -> bool:
    """A log axis for positive values spanning more than ~1.5 decades (a loss from 2.3 to 0.02)."""
    values = np.asarray(values, dtype=float)
    finite = values[np.isfinite(values)]
    return bool(finite.size and finite.min() > 0 and finite.max() / finite.min() > 30)
