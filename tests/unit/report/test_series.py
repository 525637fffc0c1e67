"""Downsampling keeps every extreme within a bounded number of points; smoothing is TensorBoard's
debiased EMA; ticks are round numbers."""

from __future__ import annotations

import numpy as np
import pytest

from gputrain.report.scale import format_number, linear_ticks, log_ticks
from gputrain.report.series import MAX_BUCKETS, downsample, smooth, thin_curve


def test_a_million_points_become_at_most_two_per_bucket_and_keep_every_spike():
    n = 1_000_000
    xs = np.arange(1, n + 1, dtype=float)
    ys = np.random.default_rng(0).normal(1.0, 0.01, n)
    spikes = [17, 123_457, 999_998]
    ys[spikes] = [50.0, -40.0, 30.0]
    ys[500_000] = np.nan  # a non-finite loss: a gap
    dx, dy = downsample(xs, ys)
    assert len(dx) <= 2 * MAX_BUCKETS + 2 + 1  # the lowest and highest of each bucket, the ends, the gap
    assert dx[0] == 1 and dx[-1] == n and np.all(np.diff(dx) > 0)
    for i in spikes:
        assert xs[i] in dx and dy[dx == xs[i]][0] == ys[i]
    assert np.isnan(dy).sum() == 1
    # every bucket's lowest and highest value are kept, so the drawn envelope is the true one
    edges = np.linspace(1, n, MAX_BUCKETS + 1)
    for lo, hi in zip(edges[:-1:97], edges[1::97]):
        inside = (xs >= lo) & (xs < hi) & np.isfinite(ys)
        kept = (dx >= lo) & (dx < hi) & np.isfinite(dy)
        assert dy[kept].max() == ys[inside].max() and dy[kept].min() == ys[inside].min()


def test_short_curves_are_kept_whole():
    xs, ys = np.arange(10.0), np.arange(10.0) ** 2
    dx, dy = downsample(xs, ys)
    assert (dx == xs).all() and (dy == ys).all()


def test_smoothing_is_a_debiased_ema_that_skips_gaps():
    ys = np.array([4.0, 2.0, np.nan, 1.0])
    span = 3
    beta = 1 - 2 / (span + 1)
    out = smooth(ys, span)
    assert out[0] == pytest.approx(4.0)  # debiased: the first point is itself, not pulled to 0
    assert out[1] == pytest.approx((beta * (1 - beta) * 4 + (1 - beta) * 2) / (1 - beta**2))
    assert out[2] == pytest.approx(out[1])
    assert (smooth(ys, 1)[[0, 1, 3]] == ys[[0, 1, 3]]).all()


def test_thinned_curves_keep_their_ends_and_their_shape():
    t = np.linspace(0, 1, 20_001)
    xs, ys = t, np.sqrt(t)
    tx, ty = thin_curve(xs, ys)
    assert len(tx) < 1000 and (tx[0], ty[0], tx[-1], ty[-1]) == (0, 0, 1, 1)
    assert np.abs(np.interp(xs, tx, ty) - ys).max() < 2e-3


@pytest.mark.parametrize(("low", "high", "ticks"), [(0, 1, [0, 0.2, 0.4, 0.6, 0.8, 1.0]), (3, 38, [10, 20, 30]),
                                                    (0.0005, 0.0021, [0.0005, 0.001, 0.0015, 0.002])])
def test_linear_ticks_are_round(low, high, ticks):
    assert linear_ticks(low, high) == pytest.approx(ticks)


def test_log_ticks_are_powers_of_ten():
    assert log_ticks(1e-7, 10) == pytest.approx([1e-7, 1e-5, 1e-3, 1e-1, 10])  # every other decade of 9
    assert log_ticks(0.02, 2.5) == pytest.approx([0.02, 0.05, 0.1, 0.2, 0.5, 1, 2])


def test_numbers_read_short():
    assert [format_number(v) for v in (0, 0.25, 1500, 25_000, 3e6, 2e-5, 1.23456)] == [
        "0", "0.25", "1500", "25k", "3M", "2e-5", "1.235"]


def test_the_smoothing_span_grows_with_the_curve_and_a_short_one_still_gets_one():
    from gputrain.report.series import ema_span

    assert [ema_span(n) for n in (3, 16, 38, 100, 1000, 1_000_000)] == [1, 2, 4, 5, 20, 20_000]
