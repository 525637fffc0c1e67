"""How fast a run went and why: the step's time split, MFU and where its peak came from, FLOPs,
memory (each rank's, where several ran); and for a profiled run, the advisor's findings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gputrain.report.curves import step_figure
from gputrain.report.escape import esc
from gputrain.report.page import Cell, Row, facts, num, number, plots, table
from gputrain.report.rl import rl_facts
from gputrain.report.rundir import Run
from gputrain.report.scale import format_number
from gputrain.report.svg import Figure, stacked_bars

PARTS = {
    "data": "#9467bd",
    "h2d": "#8c564b",
    "forward_backward": "#1f77b4",
    "optimizer": "#ff7f0e",
    "comm": "#d62728",
    "other": "#7f7f7f",
}
"""The step's parts (observe/breakdown.py), each with its colour."""
_FROM_ROWS = "No summary.json yet: the figures are the last logged row's."
_PEAK_SOURCES = {
    "bench": "measured by gputrain bench on this machine",
    "datasheet": "the GPU's datasheet peak",
}


def _train(run: Run) -> dict[str, Any]:
    return dict((run.summary or {}).get("train") or {})


def time_split(run: Run) -> dict[str, float | None] | None:
    """The share of each part of a step: summary.json's, else the last logged row's (a run in progress)."""
    split = _train(run).get("time_breakdown")
    if isinstance(split, dict) and split:
        return {p: number(split.get(p)) for p in PARTS}
    last = {p: run.steps.last(f"time_{p}") for p in PARTS}
    return last if any(v is not None for v in last.values()) else None


def speed_figures(run: Run) -> dict[str, Any]:
    """The speed facts of one run, from summary.json (the whole run), else from the last logged
    row (a run in progress). A figure that is not a number in the file is None (shown as "–")."""
    train = _train(run)

    def latest(key: str) -> float | None:
        return number(train.get(key)) if train else run.steps.last(key)

    rl = run.is_rl  # its "samples" are environment steps: named so, and it has no FLOPs to count
    return {
        "step time": latest("step_time_s"),
        "samples/s": None if rl else latest("samples_per_s"),
        "env steps/s": number(rl_facts(run).get("env_steps_per_s")) if rl else None,
        "tokens/s": latest("tokens_per_s"),
        "FLOPs/step": number(train.get("flops_per_step")),
        "achieved FLOP/s": latest("achieved_flops"),
        "MFU": latest("mfu"),
        "MFU (formula)": latest("mfu_formula"),
        "peak source": None if train.get("mfu_peak_source") is None else str(train["mfu_peak_source"]),
        "peak memory": latest("peak_memory_bytes"),
        "host peak RSS": number(train.get("host_peak_rss_bytes")),
        "from rows": not train,
    }


def _bytes(value: float | None) -> str:
    return "–" if value is None else f"{format_number(float(value))}B"


def _describe_peak(source: str | None) -> str:
    if not source:
        return "no peak known for this device and precision (gputrain bench measures one)"
    for key, text in _PEAK_SOURCES.items():
        if source.startswith(key):
            return f"{text} ({source})"
    return source


def _memory_tile(run: Run, f: dict[str, Any]) -> tuple[str, str]:
    """The peak memory tile, named for what was measured: the allocator's peak on a GPU, the
    process's resident set elsewhere; on several ranks, the largest rank's, and which."""
    on_gpu = str(run.resolved("device") or "").startswith("cuda")
    name = "peak device memory" if on_gpu else "peak memory (host RSS)"
    rank, ranks = _train(run).get("peak_memory_rank"), rank_peaks(run)
    if ranks and isinstance(rank, int) and 0 <= rank < len(ranks):  # a hand-edited rank past the list: none
        name += f", rank {rank} of {len(ranks)}"
    return (name, _bytes(f["peak memory"]))


def rank_peaks(run: Run) -> list[tuple[float | None, int | None]]:
    """Each rank's (peak memory, the step it was read at) from summary.json, where several ranks ran
    (an older summary has rank 0's alone: none)."""
    train = _train(run)
    by_rank, steps = train.get("peak_memory_by_rank"), train.get("peak_memory_by_rank_step")
    if not isinstance(by_rank, list) or len(by_rank) < 2:
        return []
    steps = steps if isinstance(steps, list) else []
    return [
        (number(peak), step if i < len(steps) and isinstance(step := steps[i], int) else None)
        for i, peak in enumerate(by_rank)
    ]


def rank_peaks_html(run: Run) -> str:
    """A table of each rank's peak memory, the largest marked; a rank whose figure is older than the
    run's end, or missing, is said to be (the run ended without the ranks meeting: rank_memory.py)."""
    ranks = rank_peaks(run)
    if not ranks:
        return ""
    largest = max((peak for peak, _ in ranks if peak is not None), default=None)
    end = (run.summary or {}).get("global_step")
    rows: list[Row] = []
    older = False
    for rank, (peak, step) in enumerate(ranks):
        if peak is None:
            read = "missing: never gathered"
        elif step is None:
            read = "step not recorded"
        elif step != end:
            read, older = f"at step {step}", True
        else:
            read = "at the end"
        rows.append([str(rank), Cell(_bytes(peak), peak, best=peak is not None and peak == largest), read])
    body = "<h3>peak memory by rank</h3>" + table(["rank", "peak memory", "read"], rows)
    if older or any(peak is None for peak, _ in ranks):
        body += (
            '<p class="note">The run ended without its ranks meeting again (a failure, or a stop at once): '
            "a figure read before the end is what that rank had reached by then, a missing one was never "
            "gathered.</p>"
        )
    return body


def _rl_speed_html(run: Run, f: dict[str, Any]) -> str:
    """An RL run's speed: a PPO iteration (one rollout and its update) and environment steps/s."""
    tiles = [
        ("iteration time", f"{1000 * f['step time']:.1f} ms" if f["step time"] else "–"),
        ("env steps/s", f"{f['env steps/s']:,.0f}" if f["env steps/s"] else "–"),
        _memory_tile(run, f),
    ]
    return facts(tiles) + rank_peaks_html(run) + (f'<p class="note">{_FROM_ROWS}</p>' if f["from rows"] else "")


def speed_html(run: Run) -> str:
    f = speed_figures(run)
    if run.is_rl:
        return _rl_speed_html(run, f)
    tiles = [
        ("step time", f"{1000 * f['step time']:.2f} ms" if f["step time"] else "–"),
        ("samples/s", f"{f['samples/s']:,.0f}" if f["samples/s"] else "–"),
    ]
    if f["tokens/s"]:
        tiles.append(("tokens/s", f"{f['tokens/s']:,.0f}"))
    tiles += [
        ("FLOPs/step", format_number(f["FLOPs/step"]) if f["FLOPs/step"] else "–"),
        ("achieved FLOP/s", format_number(f["achieved FLOP/s"]) if f["achieved FLOP/s"] else "–"),
        ("MFU", f"{100 * f['MFU']:.1f}%" if f["MFU"] is not None else "–"),
    ]
    if f["MFU (formula)"] is not None:
        tiles.append(("MFU (6N+12LHQT)", f"{100 * f['MFU (formula)']:.1f}%"))
    tiles.append(_memory_tile(run, f))
    body = facts(tiles)
    body += f'<p class="note">MFU peak: {esc(_describe_peak(f["peak source"]))}.'
    if f["from rows"]:
        body += f" {_FROM_ROWS}"
    body += "</p>" + rank_peaks_html(run)
    figures: list[Figure] = []
    split = time_split(run)
    if split:
        figures.append(
            stacked_bars(
                "where a step's time goes",
                [("step", split)],
                PARTS,
                note="measured on sampled steps (log.breakdown_every); comm is null (not measured) where "
                "tensor or pipeline parallel traffic is inside forward_backward",
            )
        )
    for fig in (
        step_figure([run], "step_time_s", "step time", "seconds", y_zero=True),
        step_figure([run], "peak_memory_bytes", "peak memory", "bytes", y_zero=True, y_log=False),
    ):
        if fig is not None:
            figures.append(fig)
    return body + plots(figures, "step")


def compare_speed_html(runs: Sequence[Run]) -> str:
    rl = any(run.is_rl for run in runs)  # an RL run's step is an iteration, its rate env steps/s
    rows: list[Row] = []
    for run in runs:
        f = speed_figures(run)
        rows.append(
            [
                run.name,
                num(1000 * f["step time"] if f["step time"] else None, 2),
                num(f["samples/s"], 0),
                *([num(f["env steps/s"], 0)] if rl else []),
                num(f["tokens/s"], 0),
                num(100 * f["MFU"] if f["MFU"] is not None else None, 1),
                f["peak source"] or "–",
                Cell(_bytes(f["peak memory"]), f["peak memory"]),
            ]
        )
    step = "step or iteration time (ms)" if rl else "step time (ms)"
    rates = ["samples/s", "env steps/s"] if rl else ["samples/s"]
    body = table(["run", step, *rates, "tokens/s", "MFU %", "MFU peak from", "peak memory"], rows)
    bars = [(run.name, split) for run in runs if (split := time_split(run))]
    if bars:
        body += plots([stacked_bars("where a step's time goes", bars, PARTS)])
    return body


def profile_html(run: Run) -> str:
    """The advisor's findings from profile.json (gputrain profile), with the facts they rest on."""
    profile = run.profile
    if not profile:
        return ""
    findings = profile.get("findings") or []
    if findings:
        items = "".join(
            f"<li><b>{esc(f.get('bottleneck'))}</b>: {esc(f.get('evidence'))} → <b>{esc(f.get('change'))}</b></li>"
            for f in findings
            if isinstance(f, dict)
        )
        body = f"<ul>{items}</ul>"
    else:
        body = '<p class="note">No finding: no bottleneck the advisor knows of.</p>'
    facts_rows = [[str(k), _show(v)] for k, v in (profile.get("facts") or {}).items()]
    if facts_rows:
        body += "<details><summary>the measured facts behind the findings</summary>"
        body += table(["fact", "value"], facts_rows, sortable=False) + "</details>"
    for key, title in (("top_device_ops", "top ops by device time"), ("top_host_ops", "top ops by host time")):
        ops = [op for op in profile.get(key) or [] if isinstance(op, dict)]
        if ops:
            rows: list[Row] = [
                [
                    str(op.get("name", ""))[:80],
                    Cell(str(op.get("calls")), number(op.get("calls"))),
                    num((number(op.get("self_device_us")) or 0) / 1000, 3),
                    num((number(op.get("self_host_us")) or 0) / 1000, 3),
                ]
                for op in ops
            ]
            body += f"<h3>{esc(title)}</h3>" + table(["op", "calls", "self device ms", "self host ms"], rows)
    return body


def _show(value: Any) -> str:
    return format_number(value) if isinstance(value, float) else str(value)
