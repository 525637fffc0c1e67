"""The tune's table as text: one row per candidate, printed as it fills (cli/tune.py) and in the same
columns in the report (report/tune.py draws its own HTML of the rows)."""

from __future__ import annotations

from gputrain.terminal import printable
from gputrain.tune.scheduler import Result

LABEL = 44


def header() -> str:
    return f"{'status':<8} {'candidate':<{LABEL}} {'samples/s':>10} {'step ms':>8} {'compile s':>9}  peak MiB per rank"


def _num(value: float | None, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"


def peaks_mib(peaks: list[int | None]) -> str:
    return ",".join("-" if p is None else f"{p / 2**20:.0f}" for p in peaks) or "-"


def row(r: Result) -> str:
    step_ms = None if r.step_time_s is None else r.step_time_s * 1000
    line = (
        f"{r.status:<8} {r.candidate.label():<{LABEL}} {_num(r.samples_per_s, ',.0f'):>10} "
        f"{_num(step_ms, '.1f'):>8} {_num(r.compile_s, '.1f'):>9}  {peaks_mib(r.peak_memory_by_rank)}"
    )
    runs = f"  median of {len(r.measured)} runs" if len(r.measured) > 1 else ""
    return printable(line + runs + (f"  {r.reason}" if r.reason else ""))
