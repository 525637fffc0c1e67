"""Show benchmark figures as a table with readable units."""

from __future__ import annotations

from gputrain.bench.report import BenchReport

__all__ = ["format_value", "render_table"]


def format_value(value: float, unit: str) -> str:
    """1.23e12 FLOP/s → "1.23 TFLOP/s"; ratios as "12.3x"."""
    if unit == "x":
        return f"{value:.1f}x"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def render_table(report: BenchReport) -> str:
    d = report.device
    rows = [("bench", "dtype", "size", "value")]
    rows += [(r.bench, r.dtype, r.size, format_value(r.value, r.unit)) for r in report.results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        f"{d['name']} (torch {d['torch']}, driver {d.get('driver') or '-'}, "
        f"{d['threads']} CPU threads, {d['mode']} mode)",
        "",
    ]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3])
    lines += [""] + [f"note: {n}" for n in report.notes]
    return "\n".join(lines)
