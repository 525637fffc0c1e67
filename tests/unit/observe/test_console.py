"""The terminal output: the progress bar keeps up with the run without being told every step, and
plain lines stay one line each."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gputrain.observe import console as console_module
from gputrain.observe.console import RunConsole


def _bar(monkeypatch: pytest.MonkeyPatch) -> tuple[RunConsole, io.StringIO, list[int]]:
    out = io.StringIO()
    run = RunConsole("bar")
    run.console = Console(file=out, force_terminal=True, width=120, highlight=False)
    updates: list[int] = []
    real = console_module.Progress.update

    def counted(self, task, **fields):  # type: ignore[no-untyped-def]
        if "completed" in fields:
            updates.append(fields["completed"])
        real(self, task, **fields)

    monkeypatch.setattr(console_module.Progress, "update", counted)
    return run, out, updates


def test_the_bar_is_not_told_every_step_but_always_shows_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    run, out, updates = _bar(monkeypatch)
    run.start(total_steps=5000, done=0)
    for step in range(1, 5001):
        run.advance(step)
    assert run._progress is not None
    assert len(updates) < 100  # a tight loop of 5,000 steps: a few updates, not one per step
    run.stop()
    assert updates[-1] == 5000  # stopping shows the step the run ended at
    assert "5000/5000" in out.getvalue()


def test_what_is_printed_above_the_bar_comes_after_the_bar_caught_up(monkeypatch: pytest.MonkeyPatch) -> None:
    run, _, updates = _bar(monkeypatch)
    run.start(total_steps=100, done=0)
    for step in range(1, 38):
        run.advance(step)
    run.logged({"step": 37, "epoch": 1, "loss": 0.5, "lr": 1e-3}, 100)
    assert updates[-1] == 37
    for step in range(38, 65):
        run.advance(step)
    run.evaluated("val", 1, {"loss": 0.4})
    assert updates[-1] == 64
    run.stop()


def test_a_resumed_bar_starts_at_the_resumed_step(monkeypatch: pytest.MonkeyPatch) -> None:
    run, out, updates = _bar(monkeypatch)
    run.start(total_steps=10, done=6)
    run.stop()
    assert updates == []  # nothing advanced: the bar was never told otherwise
    assert "6/10" in out.getvalue()


def test_plain_lines_are_one_line_each_however_long(capsys: pytest.CaptureFixture[str]) -> None:
    run = RunConsole("plain")
    record = {"step": 10, "epoch": 3, "loss": 0.25, "lr": 1e-3, "grad_norm": 1.5, "samples_per_s": 123456.0}
    run.logged(record, 1_000_000)
    run.evaluated("val", 3, {f"metric_{i}": 0.5 for i in range(12)})  # far wider than 80 columns
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "step 10/1000000 epoch 3 loss 0.2500 lr 0.0010 grad_norm 1.5000 123,456 samples/s"
    assert len(lines) == 2 and lines[1].startswith("val epoch 3: metric_0 0.5000") and "metric_11" in lines[1]


def test_none_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    run = RunConsole("none")
    run.start(10, 0)
    run.advance(1)
    run.logged({"step": 1, "epoch": 1, "loss": 0.5, "lr": 1e-3}, 10)
    run.evaluated("val", 1, {"loss": 0.4})
    run.stop()
    assert capsys.readouterr().out == ""


def _screen(written: str) -> list[str]:
    """What a terminal shows after `written`: colours dropped; carriage return, erase line, cursor up
    and newline followed."""
    import re

    rows, row, col, i = [""], 0, 0, 0
    while i < len(written):
        code = re.match(r"\x1b\[\??(\d*)([A-Za-z])", written[i:])
        if code:
            if code.group(2) == "A":
                row = max(0, row - int(code.group(1) or 1))
            elif code.group(2) == "K":
                rows[row], col = "", 0
            i += code.end()
            continue
        char = written[i]
        if char == "\r":
            col = 0
        elif char == "\n":
            row, col = row + 1, 0
            rows.extend([""] * (row + 1 - len(rows)))
        else:
            rows[row] = rows[row][:col].ljust(col) + char + rows[row][col + 1 :]
            col += 1
        i += 1
    return [r.rstrip() for r in rows if r.strip()]


def test_a_line_above_the_bar_is_printed_without_drawing_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich's print redraws the whole bar with each line (~1 ms); the line is written in the bar's
    place instead, and the bar drawn again below it at its next refresh."""
    monkeypatch.setattr(console_module, "BAR_REFRESH_S", 100.0)  # no refresh of its own during the test
    run, out, _ = _bar(monkeypatch)
    run.start(total_steps=100, done=0)
    for step in range(1, 65):
        run.advance(step)
    drawn = out.getvalue().count("/100")  # the bar, as drawn when the run started
    run.evaluated("val", 1, {"accuracy": 0.75, "loss": 0.4})
    run.evaluated("val", 2, {"accuracy": 0.8, "loss": 0.3})
    assert out.getvalue().count("/100") == drawn == 1  # not drawn again with each line
    run.stop()
    screen = _screen(out.getvalue())
    assert screen[:2] == ["val epoch 1: accuracy 0.7500  loss 0.4000", "val epoch 2: accuracy 0.8000  loss 0.3000"]
    assert len(screen) == 3 and screen[2].startswith("train") and "64/100" in screen[2]


# ---------------------------------------------------------------- off a terminal: no wrapping at 80 columns
class _Pipe(io.StringIO):
    def __init__(self, terminal: bool) -> None:
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


LONG = "val epoch 1: " + "  ".join(f"metric_{i} 0.{i:04d}" for i in range(12)) + " /a/long/run/dir/" + "x" * 60


@pytest.mark.parametrize("terminal", [False, True])
def test_lines_to_a_file_are_not_wrapped_and_a_terminal_keeps_its_width(
    monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    out = _Pipe(terminal)
    monkeypatch.setattr("sys.stdout", out)
    run = RunConsole("auto")
    run.info(LONG)
    run.console.print("run directory: " + LONG)
    lines = out.getvalue().splitlines()
    if terminal:  # rich measures the terminal (80 columns where it cannot): it wraps there, as it should
        assert run.console.width < len(LONG)
    else:
        assert [line.rstrip() for line in lines] == [LONG, "run directory: " + LONG]


def test_columns_set_by_the_user_still_sets_the_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr("sys.stdout", _Pipe(False))
    assert RunConsole("plain").console.width == 100
