"""What the user sees in the terminal: the device line, a progress bar (or plain lines), the
per-epoch validation metrics and the final table."""

from __future__ import annotations

import shlex
import sys
import time
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from gputrain.terminal import rich_console


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4f}"
    return str(value)


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def format_split(split: dict[str, float | None]) -> str:
    """A step's time split on one line: "data 2% fwd+bwd 61% optim 30% comm 5% other 2%".
    Parts under 0.5% are left out, and so are parts that were not measured (null)."""
    short = {"forward_backward": "fwd+bwd", "optimizer": "optim"}
    return " ".join(f"{short.get(k, k)} {100 * v:.0f}%" for k, v in split.items() if v is not None and v >= 0.005)


def speed_rows(train: dict[str, Any]) -> list[tuple[str, str]]:
    """The speed report's rows of the final table (step time, FLOPs, where the time went, memory)."""
    rows: list[tuple[str, str]] = []
    if train.get("step_time_s"):
        rows.append(("step time", f"{1000 * train['step_time_s']:.2f} ms"))
    if train.get("flops_per_step"):
        rows.append(("FLOPs/step", _si(train["flops_per_step"], "FLOP")))
    if train.get("achieved_flops"):
        rows.append(("achieved", _si(train["achieved_flops"], "FLOP/s")))
    if train.get("mfu_formula") is not None:
        rows.append(("MFU (6N+12LHQT)", f"{100 * train['mfu_formula']:.1f}%"))
    if train.get("mfu_peak_source"):
        rows.append(("peak from", str(train["mfu_peak_source"])))  # whole: a cut sentence misleads
    split = train.get("time_breakdown")
    if split:
        rows.append(("time split", format_split(split)))
    if train.get("peak_memory_bytes"):
        rows.append(("peak memory", _si(train["peak_memory_bytes"], "B") + _of_rank(train)))
    return rows


def _of_rank(train: dict[str, Any]) -> str:
    """Which rank the peak is, where several ranks ran: " (rank 1 of 2)", with the ranks missing."""
    by_rank, rank = train.get("peak_memory_by_rank"), train.get("peak_memory_rank")
    if not isinstance(by_rank, list) or len(by_rank) < 2 or not isinstance(rank, int) or not 0 <= rank < len(by_rank):
        return ""
    missing = [str(r) for r, peak in enumerate(by_rank) if peak is None]
    said = f"; {'rank' if len(missing) == 1 else 'ranks'} {', '.join(missing)} not known" if missing else ""
    return f" (rank {rank} of {len(by_rank)}{said})"


BAR_REFRESH_S = 0.25
"""How often the bar is redrawn, and at most how often its step count is updated: a bar redrawn
10 times a second (rich's default) and told every step costs a small model's run a few percent of
its time, for changes faster than the eye follows."""


class RunConsole:
    """Rank 0's terminal output. `mode`: bar, plain, none, or auto (bar in a terminal)."""

    def __init__(self, mode: str, enabled: bool = True, run_dir_kept: bool = True) -> None:
        self.console = rich_console(sys.stdout)
        self.run_dir_kept = run_dir_kept
        """False for a smoke run, whose directory is removed at its end: the final table then points
        at no directory (a `see it:` line would name one that is gone)."""
        if mode == "auto":
            mode = "bar" if sys.stdout.isatty() else "plain"
        self.mode = mode if enabled else "none"
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task: Any = None
        self._step = 0  # the last step advanced to; the bar shows it within BAR_REFRESH_S
        self._shown = 0
        self._next_update = 0.0

    def _line(self, text: str) -> None:
        """A plain line as it is: rich's print (markup, wrapping to the terminal's width) costs
        ~0.5 ms a line, and a log line should stay one line whatever its length."""
        self.console.file.write(text + "\n")
        self.console.file.flush()

    def info(self, text: str) -> None:
        if self.mode != "none":
            self.console.print(text)

    def notice(self, text: str) -> None:
        """A line rank 0 prints whatever log.progress says: why a command changed nothing."""
        if self.enabled:
            self.console.print(text)

    def command(self, text: str) -> None:
        """A line that ends in a command to copy (a long path in it): one line, never wrapped."""
        if self.mode != "none":
            self.console.print(text, markup=False, soft_wrap=True)

    def start(self, total_steps: int, done: int) -> None:
        if self.mode != "bar":
            return
        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
            refresh_per_second=1 / BAR_REFRESH_S,
        )
        self._progress.start()
        self._task = self._progress.add_task("train", total=total_steps, completed=done, status="")
        self._step = self._shown = done

    def advance(self, step: int) -> None:
        """Step `step` is done. The bar's count is updated at most every BAR_REFRESH_S (it is
        redrawn no more often), and always before anything else is printed and at the end."""
        self._step = step
        if self._progress is not None:
            now = time.monotonic()
            if now >= self._next_update:
                self._next_update = now + BAR_REFRESH_S
                self._show_step()

    def _show_step(self) -> None:
        if self._progress is not None and self._shown != self._step:
            self._progress.update(self._task, completed=self._step)
            self._shown = self._step

    def logged(self, record: dict[str, Any], total_steps: int) -> None:
        status = f"epoch {record['epoch']} loss {_fmt(record['loss'])}"
        if self._progress is not None:
            self._show_step()
            self._progress.update(self._task, status=status)
        elif self.mode == "plain":
            speed = record.get("samples_per_s")
            self._line(
                f"step {record['step']}/{total_steps} {status} lr {_fmt(record['lr'])}"
                + (f" grad_norm {_fmt(record['grad_norm'])}" if record.get("grad_norm") is not None else "")
                + (f" {speed:,.0f} samples/s" if speed else "")
            )

    def evaluated(
        self, split: str, epoch: int | None, metrics: dict[str, float], partial_at: int | None = None
    ) -> None:
        """One line of an evaluation's metrics; `epoch` counts from 1, `partial_at`: the step a
        partial epoch stopped at (the run ended mid-epoch)."""
        where = f"{split} epoch {epoch}" if epoch is not None else split
        if epoch is not None and partial_at is not None:
            where += f" (partial, at step {partial_at})"
        text = f"{where}: " + "  ".join(f"{k} {_fmt(v)}" for k, v in metrics.items())
        if self._progress is not None:
            self._show_step()
            self._above_bar(self._progress, text)
        elif self.mode == "plain":
            self._line(text)
        else:
            self.info(text)

    @staticmethod
    def _above_bar(progress: Progress, text: str) -> None:
        """Print a line above the live bar. rich's own print re-renders the whole bar with it (~1 ms a
        line, most of an evaluation of a small model); here the bar is erased and the line written in
        its place, under the display's lock, and the bar's next refresh (within BAR_REFRESH_S) draws
        it again below. Where rich's live display lacks the parts this needs, its own print is used."""
        live = progress.live
        lock, render = getattr(live, "_lock", None), getattr(live, "_live_render", None)
        console = progress.console
        if lock is None or render is None or not hasattr(render, "_shape") or not console.is_terminal:
            console.print(text, markup=False, highlight=False)
            return
        with lock:
            erase = render.position_cursor().segment.text  # to the bar's first line, each of its lines cleared
            render._shape = None  # the next refresh draws the bar afresh below the line, moving up over nothing
            console.file.write(f"{erase}{text}\n")
            console.file.flush()

    def stop(self) -> None:
        if self._progress is not None:
            self._show_step()
            self._progress.stop()
            self._progress = None

    def final_table(self, summary: dict[str, Any], run_dir: str) -> None:
        if self.mode == "none":
            return
        table = Table(title=f"gputrain: {summary['status']}", show_header=True)
        table.add_column("result")
        table.add_column("value", justify="right")
        for split in ("test", "val"):
            for key, value in (summary.get(split) or {}).items():
                table.add_row(f"{split} {key}", _fmt(value))
            if summary.get(split):
                break
        train = summary["train"]
        table.add_row("train loss", _fmt(train["loss"]) if train["loss"] is not None else "-")
        table.add_row("samples/s", f"{train['samples_per_s']:,.0f}" if train["samples_per_s"] else "-")
        if train.get("tokens_per_s"):
            table.add_row("tokens/s", f"{train['tokens_per_s']:,.0f}")
        if train.get("mfu") is not None:
            table.add_row("MFU", f"{100 * train['mfu']:.1f}%")
        for name, text in speed_rows(train):
            table.add_row(name, text)
        table.add_row("steps", str(summary["global_step"]))
        table.add_row("wall time", f"{summary['wall_s']:.1f} s")
        table.add_row("device", f"{summary['device']} ({summary['precision']})")
        self.console.print(table)
        if not self.run_dir_kept:
            return
        self.console.print(f"run directory: {run_dir}")
        # one unwrapped line, so a long path can be copied as the command it is
        self.console.print(f"see it: gputrain report {shlex.quote(run_dir)}", markup=False, soft_wrap=True)
