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
