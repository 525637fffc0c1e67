"""Text from names and files reaches the terminal as characters (issue 34, a neighbour of the
report's script injection): a run directory named with ESC sequences or a bidirectional override,
and a hand-edited run file's field holding them, are shown escaped in the error line, the log
lines and the report's notes, never sent to the terminal as control sequences."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gputrain.observe.logger import setup_logging
from gputrain.terminal import printable
from tests.conftest import run_cli

HOSTILE = {
    "clear screen": "\x1b[2J\x1b[H",
    "window title": "\x1b]0;owned\x07",
    "colour": "\x1b[31mred",
    "carriage return": "hidden\rshown",
    "backspace": "abc\x08\x08\x08xyz",
    "bidi override": "evil\u202etxt.exe",
    "c1 CSI": "\x9b2J",
    "NUL": "a\x00b",
    "DEL": "a\x7fb",
}
_RAW = set("\x1b\x07\r\x08\u202e\x9b\x00\x7f")


def _raw_in(text: str) -> set[str]:
    return {c for c in text if c in _RAW}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_printable_shows_every_control_as_its_escape(name: str) -> None:
    shown = printable(HOSTILE[name])
    assert not _raw_in(shown)
    assert shown.encode().decode("unicode_escape") == HOSTILE[name] or "\\u" in shown  # nothing lost


def test_printable_keeps_newlines_tabs_and_text() -> None:
    assert printable("line one\n\tline two — ünïcode ✓") == "line one\n\tline two — ünïcode ✓"


@pytest.mark.parametrize("name", list(HOSTILE))
def test_an_error_naming_a_hostile_path_is_escaped(tmp_path: Path, name: str) -> None:
    missing = tmp_path / f"run{HOSTILE[name]}".replace("\x00", "0")  # a path cannot hold NUL
    result = run_cli("report", str(missing), cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert not _raw_in(result.stderr), repr(result.stderr)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_log_line_with_a_hostile_value_is_escaped(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    log = setup_logging()
    handler = log.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    record = logging.LogRecord("gputrain", logging.WARNING, __file__, 1, "value %s", (HOSTILE[name],), None)
    assert not _raw_in(handler.format(record))


@pytest.mark.parametrize("name", ["clear screen", "bidi override", "window title"])
def test_the_reports_notes_show_a_hostile_run_name_and_field_escaped(tmp_path: Path, name: str) -> None:
    run = tmp_path / f"run{HOSTILE[name]}"  # its name is printed before each of its notes
    run.mkdir()
    (run / "config.toml").write_text('[model]\nname = "mlp"\n')
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    (run / "summary.json").write_text(json.dumps({"status": "completed", "global_step": HOSTILE[name]}))
    result = run_cli("report", str(run), cwd=tmp_path, timeout=120)  # the default output: inside the run
    assert result.returncode in (0, 2), result.stderr
    assert "Traceback" not in result.stderr
    assert not _raw_in(result.stdout + result.stderr), repr(result.stdout + result.stderr)
