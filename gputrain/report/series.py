"""Curves as numbers, made small enough to draw: smoothing, and downsampling that keeps extremes.

A run of a million logged steps has a million points per curve; a plot a few hundred pixels wide
shows at most two values per pixel column (the lowest and the highest). `downsample` keeps exactly
those per bucket of x, so every spike and dip of the full curve is still drawn, and the file stays
small whatever the run's length.
"""

from __future__ import annotations

import math

import numpy as np

MAX_BUCKETS = 600
"""x buckets per curve: each keeps its lowest and highest point, so at most 1,202 points per
curve, two per pixel column of a plot ~600 px wide."""


def downsample(xs: np.ndarray, ys: np.ndarray, buckets: int = MAX_BUCKETS) -> tuple[np.ndarray, np.ndarray]:
    """At most 2·buckets + 2 points of (xs, ys): the first, the last, and the lowest and highest
    point of each of `buckets` equal spans of x, in their order. Non-finite ys are gaps: a bucket
    that holds one also keeps one NaN point, so the drawn line breaks there as the full one would.

    xs must be sorted (steps are).
    """
    n = len(xs)
    if n <= 2 * buckets + 2:
        return xs, ys
    edges = np.linspace(xs[0], xs[-1], buckets + 1)
    bucket = np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, buckets - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    ends = np.r_[starts[1:], n]
    finite = np.isfinite(ys)
    keep: list[int] = [0]
    for start, end in zip(starts.tolist(), ends.tolist()):
        span = ys[start:end]
        ok = finite[start:end]
        if not ok.all():
            keep.append(start + int(np.flatnonzero(~ok)[0]))
        if ok.any():
            masked = np.where(ok, span, np.nan)
            low, high = start + int(np.nanargmin(masked)), start + int(np.nanargmax(masked))
            keep.extend(sorted((low, high)))
    keep.append(n - 1)
    index = np.unique(np.asarray(keep))
    return xs[index], ys[index]


def ema_span(n: int) -> int:
    """Points the smoothing averages over: about 2% of the curve, so a long run is smoothed as much
    as a short one looks; but at least an eighth of it up to 5 points, so the default job's ~40
    logged rows still get a smoothed line (a handful of rows: none, 1)."""
    return max(1, round(n / 50), min(5, n // 8))


def smooth(ys: np.ndarray, span: int) -> np.ndarray:
    """A debiased exponential moving average over `span` points (TensorBoard's smoothing, with the
    weight set by a span rather than a slider). Non-finite points are skipped, not spread."""
    if span <= 1:
        return ys.astype(float)
    beta = 1 - 2 / (span + 1)
    out = np.empty(len(ys), dtype=float)
    avg, weight = 0.0, 0.0
    for i, y in enumerate(ys.tolist()):
        if math.isfinite(y):
            avg = beta * avg + (1 - beta) * y
            weight = beta * weight + (1 - beta)
        out[i] = avg / weight if weight > 0 else math.nan
    return out


def thin_curve(xs: np.ndarray, ys: np.ndarray, resolution: float = 1 / 800) -> tuple[np.ndarray, np.ndarray]:
    """The points of a curve inside the unit square (ROC, precision-recall) that move it by at
    least `resolution` in x or y since the last one kept; the first and last always stay. A curve
    of 20,000 steps becomes a few hundred points that draw the same picture."""
    if len(xs) <= 2:
        return xs, ys
    keep = [0]
    last_x, last_y = float(xs[0]), float(ys[0])
    for i in range(1, len(xs) - 1):
        x, y = float(xs[i]), float(ys[i])
        if abs(x - last_x) >= resolution or abs(y - last_y) >= resolution:
            keep.append(i)
            last_x, last_y = x, y
    keep.append(len(xs) - 1)
    return xs[keep], ys[keep]
