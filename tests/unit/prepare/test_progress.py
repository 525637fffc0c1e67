"""The progress bar: on a terminal's stderr, never with --quiet or where stderr is not a terminal (a log file)."""

from __future__ import annotations

import io
import sys

import pytest

from gputrain.prepare.progress import PrepareProgress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("terminal", "quiet", "shown"), [(True, False, True), (True, True, False), (False, False, False)]
)
def test_the_bar_only_on_a_terminal_and_not_quiet(
    terminal: bool, quiet: bool, shown: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    progress = PrepareProgress(2_000_000, 0, quiet=quiet)
    progress.advance(1_000_000, 12_345)
    progress.stop()
    assert ("12,345 tokens" in err.getvalue()) == shown
    assert bool(err.getvalue()) == shown
