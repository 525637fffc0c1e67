"""The plots, drawn as inline SVG: line charts, scatter, histogram, heatmap and stacked bars.

Hand-written rather than matplotlib: a report is a single HTML file that opens offline, and SVG
written here is a few KB per plot (matplotlib's SVG writes every glyph as a path, ~10× larger, and
would be a 40 MB dependency for a reading tool). The pictures stay vectors, sharp at any zoom, and
their colours follow the page's light or dark theme through CSS classes. Each plot's axes are
recorded on the <svg> (`data-x`, `data-y`) so the page's small script can show the values under
the pointer without a copy of the data.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gputrain.report.escape import css_colour, esc
from gputrain.report.scale import Scale, data_range, format_number, wants_log

WIDTH, HEIGHT = 560, 320
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 62, 16, 12, 44
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
"""Tableau's ten categorical colours (matplotlib's default cycle): distinct, and readable on a
light and a dark background."""


_clip_ids = itertools.count(1)
"""Ids of the plot areas' clip paths: unique within a page, as SVG ids in one document must be."""


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


@dataclass(slots=True)
class Line:
    """One curve of a line chart."""

    name: str
    xs: np.ndarray
    ys: np.ndarray
    color: str
    width: float = 1.6
    opacity: float = 1.0
    dash: str | None = None
    markers: bool = False
    """A dot at every point: for curves of few points (one evaluation per epoch)."""
    in_legend: bool = True


@dataclass(frozen=True, slots=True)
class Mark:
    """A vertical line at `x`, labelled (the LR finder's suggestion)."""

    x: float
    label: str
    color: str = "#d62728"


@dataclass(slots=True)
class Figure:
    """A drawn plot: its title, the SVG, and the legend shown under it."""

    title: str
    svg: str
    legend: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(name, colour, dash) per entry."""
    note: str = ""
    """A line under the plot (what was left out, what a number means)."""


def _path(xs: np.ndarray, ys: np.ndarray) -> str:
    """An SVG path through the points; a NaN breaks it (a gap, as a missing value should look)."""
    parts: list[str] = []
    pen_down = False
    for x, y in zip(xs.tolist(), ys.tolist()):
        if not (math.isfinite(x) and math.isfinite(y)):
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{x:.1f} {y:.1f}")
        pen_down = True
    return "".join(parts)


class _Frame:
    """A plot area with its scales, grid, ticks and axis labels; charts add their marks into it."""

    def __init__(
        self,
        x: Scale,
        y: Scale,
        x_label: str,
        y_label: str,
        kind: str,
        x_format: str = "",
        y_format: str = "",
    ) -> None:
        self.x, self.y = x, y
        self.kind = kind
        self.body: list[str] = []
        grid, labels = [], []
        top, bottom = MARGIN_TOP, HEIGHT - MARGIN_BOTTOM
        left, right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
        for tick in x.ticks():
            px = x(tick)
            if left - 0.5 <= px <= right + 0.5:
                grid.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{bottom}"/>')
                labels.append(
                    f'<text x="{px:.1f}" y="{bottom + 15}" text-anchor="middle">{esc(_tick(tick, x_format))}</text>'
                )
        for tick in y.ticks():
            py = y(tick)
            if top - 0.5 <= py <= bottom + 0.5:
                grid.append(f'<line x1="{left}" y1="{py:.1f}" x2="{right}" y2="{py:.1f}"/>')
                labels.append(
                    f'<text x="{left - 6}" y="{py + 4:.1f}" text-anchor="end">{esc(_tick(tick, y_format))}</text>'
                )
        labels.append(
            f'<text x="{(left + right) / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle">'
            f"{esc(_axis_label(x_label, x))}</text>"
        )
        labels.append(
            f'<text transform="translate(14 {(top + bottom) / 2:.0f}) rotate(-90)" text-anchor="middle">'
            f"{esc(_axis_label(y_label, y))}</text>"
        )
        self.grid = f'<g class="grid">{"".join(grid)}</g>'
        self.labels = f'<g class="ticks">{"".join(labels)}</g>'
        self.box = f'<rect class="frame" x="{left}" y="{top}" width="{right - left}" height="{bottom - top}"/>'

    def render(self, title: str) -> str:
        """The SVG; the marks are clipped to the plot area (a curve may leave a fixed range)."""

        def axis(s: Scale) -> str:
            return f"{s.low!r} {s.high!r} {s.pixel_low:.1f} {s.pixel_high:.1f} {int(s.log)}"

        clip = f"plot-area-{next(_clip_ids)}"
        left, top = MARGIN_LEFT, MARGIN_TOP
        width, height = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
        return (
            f'<svg class="chart" data-kind="{self.kind}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{esc(title)}" data-x="{axis(self.x)}" data-y="{axis(self.y)}">'
            f'<defs><clipPath id="{clip}"><rect x="{left - 4}" y="{top - 4}" width="{width + 8}" '
            f'height="{height + 8}"/></clipPath></defs>'
            f'{self.box}{self.grid}{self.labels}<g class="marks" clip-path="url(#{clip})">'
            f"{''.join(self.body)}</g></svg>"
        )


def _axis_label(label: str, scale: Scale) -> str:
    return label + (" (log)" if scale.log else "")


def _tick(value: float, fmt: str) -> str:
    return f"{100 * value:.3g}%" if fmt == "%" else format_number(value)


def _scales(
    xs: np.ndarray,
    ys: np.ndarray,
    x_log: bool,
    y_log: bool | None,
    y_zero: bool,
    x_range: tuple[float, float] | None,
    y_range: tuple[float, float] | None,
) -> tuple[Scale, Scale]:
    y_log = wants_log(ys) if y_log is None else y_log
    x_low, x_high = x_range or data_range(xs, x_log)
    finite = xs[np.isfinite(xs)]
    steps = x_range is None and not x_log and bool(finite.size) and bool(np.all(finite == np.round(finite)))
    if steps:  # an axis of steps starts at the first point, and a lone point sits in the middle
        x_low, x_high = float(finite.min()), float(finite.max())
        if x_high == x_low:
            x_low, x_high = x_low - 1, x_high + 1
    y_low, y_high = y_range or data_range(ys, y_log, include_zero=y_zero)
    x = Scale(x_low, x_high, MARGIN_LEFT, WIDTH - MARGIN_RIGHT, x_log, integer=steps)
    y = Scale(y_low, y_high, HEIGHT - MARGIN_BOTTOM, MARGIN_TOP, y_log)
    return x, y


def line_chart(
    title: str,
    lines: Sequence[Line],
    *,
    x_label: str,
    y_label: str,
    x_log: bool = False,
    y_log: bool | None = None,
    y_zero: bool = False,
    y_format: str = "",
    x_range: tuple[float, float] | None = None,
    y_range: tuple[float, float] | None = None,
    marks: Sequence[Mark] = (),
    diagonal: bool = False,
    note: str = "",
) -> Figure:
    """Curves on shared axes. `y_log` None: log where the values span decades; `y_format` "%":
    values are fractions shown as percentages; `diagonal`: the chance line of a ROC curve."""
    all_x = np.concatenate([ln.xs for ln in lines]) if lines else np.zeros(0)
    all_y = np.concatenate([ln.ys for ln in lines]) if lines else np.zeros(0)
    x, y = _scales(all_x.astype(float), all_y.astype(float), x_log, y_log, y_zero, x_range, y_range)
    frame = _Frame(x, y, x_label, y_label, "line", y_format=y_format)
    if diagonal:
        frame.body.append(f'<line class="chance" x1="{x(0):.1f}" y1="{y(0):.1f}" x2="{x(1):.1f}" y2="{y(1):.1f}"/>')
    for line in lines:
        px, py = x.pixels(line.xs), y.pixels(line.ys)
        dash = f' stroke-dasharray="{esc(line.dash)}"' if line.dash else ""
        opacity = f' stroke-opacity="{line.opacity}"' if line.opacity < 1 else ""
        d = _path(px, py)
        if d:
            frame.body.append(
                f'<path class="series" data-name="{esc(line.name)}" d="{d}" stroke="{css_colour(line.color)}" '
                f'stroke-width="{line.width}"{dash}{opacity}/>'
            )
        if line.markers:
            dots = "".join(
                f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3"/>'
                for a, b in zip(px.tolist(), py.tolist())
                if math.isfinite(a) and math.isfinite(b)
            )
            frame.body.append(
                f'<g class="dots" data-name="{esc(line.name)}" fill="{css_colour(line.color)}">{dots}</g>'
            )
    for mark in marks:
        mark_x = x(mark.x)
        frame.body.append(
            f'<line class="mark" x1="{mark_x:.1f}" y1="{MARGIN_TOP}" x2="{mark_x:.1f}" y2="{HEIGHT - MARGIN_BOTTOM}" '
            f'stroke="{css_colour(mark.color)}"/><text class="mark-label" x="{mark_x + 4:.1f}" y="{MARGIN_TOP + 12}" '
            f'fill="{css_colour(mark.color)}">{esc(mark.label)}</text>'
        )
    legend = [(ln.name, ln.color, ln.dash) for ln in lines if ln.in_legend]
    return Figure(title, frame.render(title), legend if len(legend) > 1 else [], note)


def scatter(
    title: str, xs: np.ndarray, ys: np.ndarray, *, x_label: str, y_label: str, diagonal: bool = False, note: str = ""
) -> Figure:
    """Points; `diagonal`: the y = x line over the common range (predicted against true)."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    both = np.concatenate([xs, ys])
    shared = data_range(both, False) if diagonal else None
    x, y = _scales(xs, ys, False, False, False, shared, shared)
    frame = _Frame(x, y, x_label, y_label, "scatter")
    if diagonal and shared is not None:
        low, high = shared
        frame.body.append(
            f'<line class="chance" x1="{x(low):.1f}" y1="{y(low):.1f}" x2="{x(high):.1f}" y2="{y(high):.1f}"/>'
        )
    px, py = x.pixels(xs), y.pixels(ys)
    dots = "".join(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2"/>' for a, b in zip(px.tolist(), py.tolist()))
    frame.body.append(f'<g class="dots points" fill="{css_colour(color(0))}" fill-opacity="0.45">{dots}</g>')
    return Figure(title, frame.render(title), [], note)


def histogram(title: str, values: np.ndarray, *, x_label: str, bins: int = 40, note: str = "") -> Figure:
    """Counts of `values` in `bins` equal bins."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    counts, edges = np.histogram(values, bins=bins) if values.size else (np.zeros(1), np.array([0.0, 1.0]))
    x = Scale(
        float(edges[0]),
        float(edges[-1]) if edges[-1] > edges[0] else float(edges[0]) + 1,
        MARGIN_LEFT,
        WIDTH - MARGIN_RIGHT,
    )
    y = Scale(0.0, float(max(counts.max(), 1)) * 1.05, HEIGHT - MARGIN_BOTTOM, MARGIN_TOP)
    frame = _Frame(x, y, x_label, "samples", "histogram")
    bars = []
    for count, left, right in zip(counts.tolist(), edges[:-1].tolist(), edges[1:].tolist()):
        if count:
            top = y(count)
            bars.append(
                f'<rect x="{x(left):.1f}" y="{top:.1f}" width="{max(x(right) - x(left) - 1, 0.5):.1f}" '
                f'height="{y(0) - top:.1f}"><title>{format_number(left)} to {format_number(right)}: '
                f"{count}</title></rect>"
            )
    frame.body.append(f'<g class="bars" fill="{css_colour(color(0))}">{"".join(bars)}</g>')
    return Figure(title, frame.render(title), [], note)


def heatmap(
    title: str,
    counts: np.ndarray,
    labels: Sequence[str],
    *,
    x_label: str,
    y_label: str,
    note: str = "",
) -> Figure:
    """A square matrix of counts (a confusion matrix: rows true, columns predicted). Each cell's
    shade is its share of the row, so a class's recall reads along the diagonal whatever its size."""
    k = len(labels)
    side = min(WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT * 1.6)
    size = side / max(k, 1)
    height = int(MARGIN_TOP + side + MARGIN_BOTTOM)
    rows = counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(rows > 0, counts / np.maximum(rows, 1), 0.0)
    left = MARGIN_LEFT + (WIDTH - MARGIN_LEFT - MARGIN_RIGHT - side) / 2
    cells, text = [], []
    font = max(7.0, min(13.0, size * 0.38))
    for i in range(k):
        for j in range(k):
            cx, cy = left + j * size, MARGIN_TOP + i * size
            alpha = float(share[i, j])
            fill = "#2ca02c" if i == j else "#d62728"
            # the square root lifts small shares: one error in fifty must still catch the eye
            opacity = 0.12 + 0.88 * math.sqrt(alpha) if counts[i, j] else 0.0
            tip = f"true {labels[i]}, predicted {labels[j]}: {int(counts[i, j])} ({100 * alpha:.1f}% of the row)"
            cells.append(
                f'<rect x="{cx:.1f}" y="{cy:.1f}" width="{size:.1f}" height="{size:.1f}" fill="{css_colour(fill)}" '
                f'fill-opacity="{opacity:.3f}"><title>{esc(tip)}</title></rect>'
            )
            if counts[i, j] and size >= 14:
                text.append(
                    f'<text x="{cx + size / 2:.1f}" y="{cy + size / 2 + font / 3:.1f}" font-size="{font:.0f}" '
                    f'text-anchor="middle">{int(counts[i, j])}</text>'
                )
    ticks = []
    step = max(1, math.ceil(k / 30))
    for i in range(0, k, step):
        ticks.append(
            f'<text x="{left - 5:.1f}" y="{MARGIN_TOP + (i + 0.5) * size + 4:.1f}" text-anchor="end">'
            f"{esc(labels[i])}</text>"
        )
        ticks.append(
            f'<text x="{left + (i + 0.5) * size:.1f}" y="{MARGIN_TOP + side + 14:.1f}" text-anchor="middle">'
            f"{esc(labels[i])}</text>"
        )
    ticks.append(
        f'<text x="{left + side / 2:.1f}" y="{height - 8}" text-anchor="middle">{esc(x_label)}</text>'
        f'<text transform="translate(14 {MARGIN_TOP + side / 2:.0f}) rotate(-90)" text-anchor="middle">'
        f"{esc(y_label)}</text>"
    )
    svg = (
        f'<svg class="chart" data-kind="heatmap" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{esc(title)}">'
        f'<g class="cells">{"".join(cells)}</g><g class="cell-text">{"".join(text)}</g>'
        f'<g class="ticks">{"".join(ticks)}</g></svg>'
    )
    return Figure(title, svg, [], note)


def stacked_bars(
    title: str,
    rows: Sequence[tuple[str, dict[str, float | None]]],
    colors: dict[str, str],
    *,
    note: str = "",
) -> Figure:
    """One horizontal bar per row, split into its parts' shares (each row's shares sum to ~1);
    a part of None was not measured and takes no room."""
    bar_height, gap = 26, 12
    label_width = min(200, 12 + 7 * max((len(name) for name, _ in rows), default=4))
    height = MARGIN_TOP + len(rows) * (bar_height + gap) + 30
    left, right = label_width, WIDTH - MARGIN_RIGHT
    body = []
    for r, (name, parts) in enumerate(rows):
        top = MARGIN_TOP + r * (bar_height + gap)
        body.append(f'<text x="{left - 6}" y="{top + bar_height / 2 + 4:.1f}" text-anchor="end">{esc(name)}</text>')
        total = sum(v for v in parts.values() if v) or 1.0
        position = float(left)
        for part, value in parts.items():
            if not value:
                continue
            width = (right - left) * value / total
            body.append(
                f'<rect class="segment" data-part="{esc(part)}" x="{position:.1f}" y="{top}" width="{width:.1f}" '
                f'height="{bar_height}" fill="{css_colour(colors.get(part, "#999"))}"><title>{esc(part)}: '
                f"{100 * value:.1f}%</title></rect>"
            )
            if width > 34:
                body.append(
                    f'<text class="on-bar" x="{position + width / 2:.1f}" y="{top + bar_height / 2 + 4:.1f}" '
                    f'text-anchor="middle">{100 * value:.0f}%</text>'
                )
            position += width
    scale = "".join(
        f'<text x="{left + (right - left) * t:.1f}" y="{height - 10}" text-anchor="middle">{100 * t:.0f}%</text>'
        for t in (0, 0.25, 0.5, 0.75, 1.0)
    )
    svg = (
        f'<svg class="chart" data-kind="bars" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{esc(title)}">'
        f'<g class="ticks">{"".join(body)}{scale}</g></svg>'
    )
    used = [p for p in colors if any(parts.get(p) for _, parts in rows)]
    return Figure(title, svg, [(p, colors[p], None) for p in used], note)
