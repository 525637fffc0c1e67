"""The facts around the curves: a run's header (status, device, layout, time, steps, what was
configured away from the defaults), its failure, its machine and its whole config; for several
runs, the table of runs, the config keys that differ between them, and their final metrics."""

from __future__ import annotations

import datetime
import math
import shlex
from collections.abc import Sequence
from typing import Any

from gputrain.report.config_diff import differs_between, differs_from_defaults, show_value
from gputrain.report.escape import esc
from gputrain.report.page import Cell, Row, facts, num, shown, table
from gputrain.report.rl import rl_stop_reason, rl_tiles
from gputrain.report.rundir import Run
from gputrain.train.tasks import metric_mode

_PARALLEL_KEYS = ("dp_replicate", "dp_shard", "tp", "pp")


def badge(status: str) -> str:
    statuses = ("completed", "stopped_early", "timed_out", "failed", "interrupted", "running", "lr-find")
    known = status if status in statuses else "unknown"
    return f'<span class="badge s-{known}">{esc(status.replace("_", " "))}</span>'


def duration(seconds: object) -> str:
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "–" if seconds is None else str(seconds)  # text where a number belongs: shown as it is
    if not math.isfinite(seconds):  # NaN or Infinity in a hand-edited file: no duration to round
        return str(seconds)
    if seconds < 90:
        return f"{seconds:.1f} s"
    return str(datetime.timedelta(seconds=round(seconds)))


def layout(run: Run) -> str:
    """The parallel layout the run resolved (Run.resolved), else, from a run of an older gputrain that
    recorded none, the configured strategy and degrees with the world size the run had."""
    if run.resolved("layout"):
        return str(run.resolved("layout"))
    parallel = (run.config or {}).get("parallel", {})
    strategy = parallel.get("strategy", "auto")
    degrees = ", ".join(f"{k}={parallel[k]}" for k in _PARALLEL_KEYS if k in parallel and parallel[k] not in (1, -1))
    world = run.resolved("world_size")
    text = f"{strategy}" + (f" ({degrees})" if degrees else "")
    return text + (f" on {world} rank(s)" if world else "")


def _steps_text(run: Run) -> str:
    summary = run.summary or {}
    last = run.last_step
    if run.sweep_only:
        return f"{(run.lr_find or {}).get('steps_run', '–')} sweep steps"
    # an RL run's step is a PPO iteration (a rollout and its update); it has no epochs
    unit = " iterations" if run.is_rl else ""
    if run.status == "running" or not summary:
        return f"{last:,}{unit} so far" if last is not None else "–"
    epochs = None if run.is_rl else summary.get("epochs_completed")
    return f"{shown(summary.get('global_step', 0), ',')}{unit}" + (f" ({epochs} epochs)" if epochs is not None else "")


def _resolved(run: Run, key: str) -> str:
    """A fact the run resolved at its start (Run.resolved); a sweep's own directory has no run
    files, and its lr_find.json records them. The configured precision where none was recorded,
    unless it was `auto`, which says nothing of what ran."""
    value = (run.lr_find or {}).get(key) if run.sweep_only else run.resolved(key)
    if value is None and key == "precision":
        value = (run.config or {}).get("train", {}).get("precision")
    return "–" if value in (None, "auto") else str(value)


def header_html(run: Run) -> str:
    summary = run.summary or {}
    train = summary.get("train") or {}
    tiles = [
        ("device", _resolved(run, "device")),
        ("precision", _resolved(run, "precision")),
        ("world size", _resolved(run, "world_size")),
        ("parallel layout", layout(run)),
        ("wall time", duration(summary.get("wall_s"))),
        ("steps", _steps_text(run)),
        ("task", "reinforcement learning (PPO)" if run.is_rl else run.task or "–"),
    ]
    if run.is_rl:  # its samples are environment steps: rl_tiles names them so
        tiles += rl_tiles(run)
    elif train.get("samples_per_s"):
        tiles.append(("samples/s", shown(train["samples_per_s"], ",.0f")))
    for split in ("test", "val"):
        metrics = summary.get(split) or {}
        for key in ("accuracy", "auroc", "f1", "mse", "perplexity", "loss"):
            if isinstance(metrics.get(key), (int, float)):
                tiles.append((f"{split} {key}", f"{metrics[key]:.4f}"))
        if metrics:
            break
    body = f"<h1>{esc(run.name)} {badge(run.status)}</h1><div class='path'>{esc(run.path.resolve())}</div>"
    body += facts(tiles) + status_html(run)
    body += "".join(f'<div class="alert warn">{esc(note)}</div>' for note in run.notes)
    changed = differs_from_defaults(run.config) if run.config is not None else {}
    if changed:
        rows = [[key, show_value(value), show_value(default)] for key, (value, default) in changed.items()]
        body += "<h3>config: what differs from the defaults</h3>" + table(["key", "this run", "default"], rows)
    elif run.config is not None:
        body += '<p class="note">config: every key at its default.</p>'
    return body


def resume_command(summary: dict[str, Any], where: str) -> str:
    """The command that continues an interrupted run as written: a run directory that holds a run
    continues with its own config.toml, on as many ranks as it had (the RL loop's runs with `rl`)."""
    command = "rl" if "rl" in summary else "train"
    world = summary.get("world_size")
    ranks = f" --nproc-per-node {world}" if isinstance(world, int) and world > 1 else ""
    return f"gputrain {command}{ranks} --run-dir {where}"


def status_html(run: Run) -> str:
    """What the status means for this run, and what to do next."""
    summary = run.summary or {}
    status = run.status
    where = shlex.quote(str(run.path))
    if status == "running":
        return (
            f'<div class="alert info">Running: {esc(run.describe_running())}. This report shows what was there.</div>'
        )
    if status == "failed":
        text = f'<div class="alert"><b>Failed</b>: {esc(summary.get("error", "no error recorded"))}'
        if run.error_log:
            text += f"<details><summary>error.log (last lines)</summary><pre>{esc(run.error_log)}</pre></details>"
        return text + "</div>"
    if status == "interrupted":
        return (
            f'<div class="alert warn"><b>Interrupted</b> at step {esc(summary.get("global_step"))}; '
            f"continue it with <code>{esc(resume_command(summary, where))}</code>.</div>"
        )
    if status == "timed_out":  # train.max_time: saved, to continue with a raised limit
        return (
            f'<div class="alert warn"><b>Time limit</b>: {esc(summary.get("stop_reason", "train.max_time spent"))}; '
            f"continue it with <code>{esc(resume_command(summary, where))} train.max_time=...</code> "
            "(a longer limit).</div>"
        )
    if status == "lr-find":
        return (
            '<div class="alert info">An LR range test (<code>gputrain lr-find</code>) in a directory of its own: '
            "its curve is under LR finder; no training run is here.</div>"
        )
    if status == "stopped_early":
        why = rl_stop_reason(run) if run.is_rl else "the monitored validation metric stopped improving"
        return f'<div class="alert info">Stopped early: {esc(why)}.</div>'
    return ""


def machine_html(run: Run) -> str:
    """env.json: the facts gputrain collected about the machine the run used."""
    if not run.env:
        return ""
    machine = {k: v for k, v in run.env.items() if k != "run"}  # the run's own facts head the page
    rows = [[key, _short(value)] for key, value in _flat_env(machine)]
    return table(["fact", "value"], rows, sortable=False)


def _flat_env(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for key, inner in value.items():
            out.extend(_flat_env(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = []
        for i, inner in enumerate(value):
            out.extend(_flat_env(inner, f"{prefix}[{i}]"))
        return out
    return [(prefix, value)]


def _short(value: Any) -> str:
    text = "–" if value is None else str(value)
    return text if len(text) <= 160 else text[:157] + "..."


def config_html(run: Run) -> str:
    if run.config_text is None:
        return ""
    return (
        f"<details><summary>config.toml (the full resolved config)</summary><pre>{esc(run.config_text)}</pre></details>"
    )


def runs_table_html(runs: Sequence[Run]) -> str:
    rows: list[Row] = []
    for run in runs:
        summary = run.summary or {}
        rows.append(
            [
                run.name,
                run.status.replace("_", " "),
                run.task or "–",
                _resolved(run, "device"),
                _resolved(run, "precision"),
                layout(run),
                _steps_text(run),
                Cell(duration(summary.get("wall_s")), summary.get("wall_s")),
                str(run.path),
            ]
        )
    return table(["run", "status", "task", "device", "precision", "layout", "steps", "wall time", "directory"], rows)


def config_differences_html(runs: Sequence[Run]) -> str:
    differing = differs_between([r.config for r in runs])
    if not differing:
        missing = [r.name for r in runs if r.config is None]
        return (
            '<p class="note">'
            + (f"No config.toml in {', '.join(map(esc, missing))}." if missing else "The runs' configs are identical.")
            + "</p>"
        )
    rows = [[key, *[show_value(v) for v in values]] for key, values in differing.items()]
    return table(["key", *[r.name for r in runs]], rows)


def final_metrics_html(runs: Sequence[Run]) -> str:
    """Each run's final val and test metrics side by side, the best of each row marked (among
    runs of one task: a loss of a classifier and of a regression model are not one measure)."""
    keys: list[tuple[str, str]] = []
    for run in runs:
        for split in ("val", "test"):
            for metric in (run.summary or {}).get(split) or {}:
                if (split, metric) not in keys:
                    keys.append((split, metric))
    if not keys:
        return '<p class="note">No run has final metrics yet.</p>'
    tasks = {r.task for r in runs}
    rows: list[Row] = []
    for split, metric in keys:
        values = [((r.summary or {}).get(split) or {}).get(metric) for r in runs]
        numbers = [v for v in values if isinstance(v, (int, float))]
        best = None
        if len(numbers) > 1 and len(tasks) == 1:
            best = min(numbers) if metric_mode(metric) == "min" else max(numbers)
        cells: list[str | Cell] = [f"{split} {metric}"]
        for v in values:
            cell = num(v if isinstance(v, (int, float)) else None)
            cells.append(Cell(cell.text, cell.value, best=v is not None and v == best))
        rows.append(cells)
    return table(["metric", *[r.name for r in runs]], rows)
