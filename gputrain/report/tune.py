"""The tune table of a `gputrain tune` directory: every candidate's status, throughput, step time,
compile time and peak memory per rank, the winner marked, auto's baseline named. Every value is
the file's, escaped where it is placed (escape.py): tune.json is text anyone may have edited."""

from __future__ import annotations

import math
from typing import Any

from gputrain.report.escape import esc
from gputrain.report.rundir import Run

MIB = 2**20


def _num(value: Any, fmt: str, scale: float = 1.0) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return format(value * scale, fmt)


def _peaks(value: Any) -> str:
    if not isinstance(value, list) or not value:
        return "-"
    return ", ".join(_num(p, ".0f", 1 / MIB) for p in value)


def tune_html(run: Run) -> str:
    """The table, or "" where the directory holds no tune."""
    record = run.tune
    if record is None:
        return ""
    rows = record.get("candidates") or []
    winner, auto = record.get("winner"), record.get("auto")
    unit = record.get("unit") if record.get("unit") in ("samples/s", "tokens/s") else "samples/s"
    key = "tokens_per_s" if unit == "tokens/s" else "samples_per_s"
    body = []
    for i, row in enumerate(rows):
        mark = " (winner)" if i == winner else " (auto, the baseline)" if i == auto else ""
        cls = ' class="best"' if i == winner else ""
        body.append(
            f"<tr{cls}><td>{esc(row.get('label'))}{esc(mark)}</td>"
            f"<td>{esc(row.get('status'))}</td><td>{esc(_num(row.get(key), ',.0f'))}</td>"
            f"<td>{esc(_num(row.get('step_time_s'), '.1f', 1000))}</td>"
            f"<td>{esc(_num(row.get('compile_s'), '.1f'))}</td>"
            f"<td>{esc(_peaks(row.get('peak_memory_by_rank')))}</td><td>{esc(row.get('reason') or '')}</td></tr>"
        )
    facts = record.get("machine")
    facts = facts if isinstance(facts, dict) else {}
    machine = ", ".join(f"{esc(k)} {esc(v)}" for k, v in facts.items())
    spent, budget = esc(_num(record.get("spent_s"), ".0f")), esc(_num(record.get("budget_s"), ".0f"))
    batch = esc(_num(record.get("batch_size"), ".0f"))
    return (
        f"<p>{len(rows)} candidates, {spent} s of a {budget} s budget; batch {batch}; "
        f"on {machine or 'an unrecorded machine'}. <code>gputrain train parallel.strategy=tuned</code> applies the "
        "winner where the machine and config fingerprints match.</p>"
        f"<table><thead><tr><th>candidate</th><th>status</th><th>{esc(unit)}</th><th>step ms</th><th>compile s</th>"
        f"<th>peak MiB per rank</th><th>why</th></tr></thead><tbody>{''.join(body)}</tbody></table>"
    )
