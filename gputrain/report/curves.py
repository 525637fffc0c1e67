"""Curves against the step: training (loss, learning rate, gradient norm, speed, MFU; an RL run's
returns and PPO figures), evaluation
per split and metric, and the LR finder's loss against the learning rate.

Each function takes one run or several: one run draws its raw and smoothed curves, several runs
overlay their smoothed curves on shared axes (each run one colour, its raw curve faint behind).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gputrain.report.rl import LOSS_TITLE
from gputrain.report.rundir import Run
from gputrain.report.series import downsample, ema_span, smooth
from gputrain.report.svg import Figure, Line, Mark, color, line_chart

MIN_DRAWN = 1
"""A curve of fewer logged values than this is left out."""


def loss_figure(runs: Sequence[Run], title: str = "training loss", label_runs: bool = False) -> Figure | None:
    """The loss of each logged step, and its moving average (series.smooth). `label_runs`: name
    each curve by its run, even where it is the only one (a comparison's group of one)."""
    lines: list[Line] = []
    single = len(runs) == 1 and not label_runs
    for i, run in enumerate(runs):
        steps, loss = run.steps.get("step"), run.steps.get("loss")
        if steps is None or loss is None:
            continue
        span = ema_span(len(loss))
        raw_x, raw_y = downsample(steps, loss)
        smooth_x, smooth_y = downsample(steps, smooth(loss, span))
        colour = color(i)
        if single and span == 1:  # too few rows to smooth: the raw curve is the curve
            lines.append(Line("loss", raw_x, raw_y, colour, width=1.8, markers=len(raw_x) <= 3))
        elif single:
            lines.append(Line("loss", raw_x, raw_y, colour, width=1.1, opacity=0.35))
            lines.append(Line(f"smoothed (EMA over {span} rows)", smooth_x, smooth_y, colour, width=2))
        else:
            lines.append(Line(f"{run.name} (raw)", raw_x, raw_y, colour, width=1, opacity=0.2, in_legend=False))
            lines.append(Line(run.name, smooth_x, smooth_y, colour, width=1.8))
    if not lines:
        return None
    note = "" if single else "each run's moving average; its raw curve faint behind"
    return line_chart(title, lines, x_label="step", y_label="loss", note=note)


def step_figure(
    runs: Sequence[Run],
    key: str,
    title: str,
    y_label: str,
    *,
    y_format: str = "",
    y_zero: bool = False,
    y_log: bool | None = None,
    extra: Sequence[tuple[str, str]] = (),
) -> Figure | None:
    """One logged field against the step, one line per run; `extra`: more fields of one run,
    drawn dashed, as (key, name)."""
    lines: list[Line] = []
    for i, run in enumerate(runs):
        steps = run.steps.get("step")
        if steps is None:
            continue
        for k, (field, name) in enumerate([(key, run.name if len(runs) > 1 else y_label), *extra]):
            values = run.steps.get(field)
            if values is None:
                continue
            xs, ys = downsample(steps, values)
            colour = color(i) if len(runs) > 1 else color(k)
            lines.append(Line(name, xs, ys, colour, dash="5 3" if k else None, markers=len(xs) <= 3))
    if not lines:
        return None
    return line_chart(title, lines, x_label="step", y_label=y_label, y_format=y_format, y_zero=y_zero, y_log=y_log)


def training_figures(runs: Sequence[Run]) -> list[Figure]:
    """Loss, learning rate, gradient norm, throughput and MFU, those that were logged."""
    tokens = all(run.steps.get("tokens_per_s") is not None for run in runs)
    rate, rate_label = ("tokens_per_s", "tokens/s") if tokens else ("samples_per_s", "samples/s")
    single = len(runs) == 1
    mfu_extra = [("mfu_formula", "MFU (6N+12LHQT formula)")] if single else []
    rl = all(run.is_rl for run in runs)  # its loss is PPO's combined objective
    figures = [
        loss_figure(runs, LOSS_TITLE) if rl else loss_figure(runs),
        step_figure(runs, "lr", "learning rate", "lr", y_zero=True, y_log=False),
        step_figure(runs, "grad_norm", "gradient norm (before clipping)", "grad norm", y_zero=True),
        step_figure(runs, rate, f"throughput ({rate_label})", rate_label, y_zero=True, y_log=False),
        step_figure(runs, "mfu", "MFU", "MFU", y_format="%", y_zero=True, y_log=False, extra=mfu_extra),
        *rl_figures(runs),
    ]
    return [f for f in figures if f is not None]


def rl_figures(runs: Sequence[Run]) -> list[Figure | None]:
    """A `gputrain rl` run's rows (one per PPO iteration): returns, episode length, environment
    steps/s and the PPO figures that say whether the update is healthy."""
    if not any(run.steps.get("episodic_return") is not None for run in runs):
        return []
    window = [("return_last_100", "mean of the last 100 episodes")] if len(runs) == 1 else []
    return [
        step_figure(runs, "episodic_return", "episodic return", "return", y_log=False, extra=window),
        step_figure(runs, "episodic_length", "episode length", "steps", y_zero=True, y_log=False),
        step_figure(runs, "env_steps_per_s", "environment steps/s", "steps/s", y_zero=True, y_log=False),
        step_figure(runs, "policy_loss", "policy loss", "loss", y_log=False),
        step_figure(runs, "value_loss", "value loss", "loss", y_zero=True),
        step_figure(runs, "entropy", "policy entropy", "nats", y_log=False),
        step_figure(runs, "approx_kl", "approximate KL", "KL", y_zero=True, y_log=False),
        step_figure(runs, "clipfrac", "clip fraction", "fraction", y_zero=True, y_log=False),
    ]


def _metric_names(runs: Sequence[Run]) -> list[str]:
    names: list[str] = []
    for run in runs:
        for metrics in run.evals.values():
            names.extend(m for m in metrics if m not in names)
    return names


def eval_figures(runs: Sequence[Run], label_runs: bool = False) -> list[Figure]:
    """One plot per metric: each split's evaluations against the step (val after each epoch;
    test once, at the end, as a point). `label_runs`: as for `loss_figure`."""
    figures = []
    single = len(runs) == 1 and not label_runs
    for metric in _metric_names(runs):
        lines = []
        for i, run in enumerate(runs):
            for s, split in enumerate(sorted(run.evals, key=lambda sp: (sp != "val", sp))):
                found = run.evals[split].get(metric)
                if not found:
                    continue
                steps, values = np.asarray(found[0]), np.asarray(found[1])
                name = split if single else f"{run.name} {split}"
                colour = color(s) if single else color(i)
                lines.append(
                    Line(
                        name,
                        steps,
                        values,
                        colour,
                        width=0 if split == "test" else 1.8,
                        markers=True,
                        dash="4 3" if split == "test" and not single else None,
                    )
                )
        if lines:
            figures.append(line_chart(metric, lines, x_label="step", y_label=metric, y_log=False))
    return figures


def lr_find_figure(run: Run) -> Figure | None:
    """The LR range test: loss against the learning rate (log axis), the suggestion marked."""
    record = run.lr_find
    if not record or not record.get("lrs"):
        return None
    lrs = np.asarray(record["lrs"], dtype=float)
    losses = np.asarray(record["losses"], dtype=float)  # a null (a non-finite loss) reads as NaN
    smoothed = np.asarray(record["smoothed"], dtype=float)
    lines = [
        Line("loss", lrs, losses, color(0), width=1.1, opacity=0.4),
        Line("smoothed", lrs, smoothed, color(0), width=2),
    ]
    suggested = record.get("suggested_lr")
    # a suggestion that is not a number (a hand-edited file) is shown as text above the plot, not marked
    is_number = isinstance(suggested, (int, float)) and not isinstance(suggested, bool)
    marks = [Mark(float(suggested), f"{suggested:.2e}")] if is_number and suggested else []
    # the tail after divergence dwarfs the rest: show losses up to a little above the start
    finite = smoothed[np.isfinite(smoothed)]
    y_range = None
    if finite.size:
        low, high = float(np.nanmin(losses)), float(min(np.nanmax(losses), 1.6 * finite[0]))
        if high > low:
            y_range = (low - 0.05 * (high - low), high)
    return line_chart(
        "LR range test: loss against learning rate",
        lines,
        x_label="learning rate",
        y_label="loss",
        x_log=True,
        y_log=False,
        y_range=y_range,
        marks=marks,
    )
