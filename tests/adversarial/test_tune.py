"""`gputrain tune` and `parallel.strategy=tuned` against bad input (issue 31).

- The command's input: an unknown override, a budget that is not a duration, more ranks than the
  machine can start, a search knob out of range, a batch it cannot keep fixed, an output folder that
  is not the tune's: one line naming what is wrong, exit 2, nothing written.
- tune.json as anyone may have edited it: nothing of it is trusted. Each mutation of a good record
  leaves `train` to auto's choice (one printable line saying why) or applies only a layout rebuilt
  field by field from known kinds; the file's own override text is never passed on.
- The report's tune table: every value escaped.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gputrain.cli import main
from gputrain.config import load_config
from gputrain.report.rundir import read_run
from gputrain.report.tune import tune_html
from gputrain.tune.apply import resolve_tuned
from gputrain.tune.candidates import AUTO, Candidate
from gputrain.tune.fingerprint import config_fields
from gputrain.tune.record import TUNE, tune_record
from gputrain.tune.scheduler import Result

MACHINE = {"device": "cpu", "name": "test cpu", "count": 1, "torch": "2.x", "cores": 2, "threads": 2}
JOB = ["model.name=mlp", "data.name=synthetic", "train.batch_size=16"]

# ----------------------------------------------------------------- the command's input

BAD_COMMANDS = [
    (["model.nmae=mlp"], "model.nmae"),
    (["--budget", "5 minutes"], "--budget"),
    (["--budget", "-1"], "--budget"),
    (["--budget", "0"], "--budget"),
    (["--budget", "1e999"], "--budget"),
    (["--budget", ""], "--budget"),
    (["--budget", "2y"], "--budget"),
    (["--budget", "400d"], "--budget"),
    (["--nproc-per-node", "0"], "--nproc-per-node"),
    (["--nproc-per-node", "-2"], "--nproc-per-node"),
    (["--nproc-per-node", "two"], "--nproc-per-node"),
    (["--nproc-per-node", "4096"], "--nproc-per-node 4096"),
    (["--micro-batches", "0"], "--micro-batches"),
    (["--micro-batches", "99"], "--micro-batches"),
    (["--compile", "maybe"], "--compile"),
    (["--confirm", "-1"], "--confirm"),
    (["--confirm", "99"], "--confirm"),
    (["train.batch_size=auto"], "train.batch_size=auto"),
]


@pytest.mark.parametrize(("extra", "said"), BAD_COMMANDS, ids=[" ".join(e) or "empty" for e, _ in BAD_COMMANDS])
def test_bad_command_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], said: str
) -> None:
    out = tmp_path / "tune"
    code = _main(["tune", "--run-dir", str(out), "--budget", "1m", *JOB, *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in err, lines
    assert not out.exists()


def _main(argv: list[str]) -> int:
    """The command in this process: argparse's own refusals exit through SystemExit."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


def _foreign(folder: Path) -> Path:
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    return folder


def _a_file(folder: Path) -> Path:
    folder.write_text("a file")
    return folder


def _a_run(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.toml").write_text("")
    (folder / "summary.json").write_text("{}")
    return folder


def _not_ours(folder: Path) -> Path:
    folder.mkdir()
    (folder / TUNE).write_text('{"hand": "written"}')
    return folder


BAD_DIRS: list[tuple[str, Callable[[Path], Path], str]] = [
    ("holds the user's files", _foreign, "holds files gputrain did not write"),
    ("is a file", _a_file, "not a folder"),
    ("holds a training run", _a_run, "--run-dir"),
    ("holds a tune.json no tune wrote", _not_ours, "--run-dir"),
]


@pytest.mark.parametrize(("make", "said"), [(m, s) for _, m, s in BAD_DIRS], ids=[n for n, _, _ in BAD_DIRS])
def test_an_output_folder_not_the_tunes_is_refused_and_left_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], Path], said: str
) -> None:
    folder = make(tmp_path / "out")
    before = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else folder.read_text()
    code = _main(["tune", "--run-dir", str(folder), "--budget", "1m", *JOB])
    err = capsys.readouterr().err
    assert code == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert (sorted(p.name for p in folder.iterdir()) if folder.is_dir() else folder.read_text()) == before


# ----------------------------------------------------------------- tune.json, edited


def _good() -> dict[str, Any]:
    config = load_config(None, JOB)
    rows = [
        Result(Candidate(1, AUTO), "ok", samples_per_s=100.0),
        Result(Candidate(1, "none", 8, 2, threads=2), "ok", samples_per_s=300.0),
        Result(Candidate(2, "ddp", 8, 1, threads=1), "ok", samples_per_s=200.0),
    ]
    return tune_record(
        rows, machine=MACHINE, fields=config_fields(config), budget_s=60, spent_s=20, batch_size=16, warmup=2, timed=6
    )


def _winner(record: dict[str, Any]) -> dict[str, Any]:
    return record["candidates"][1]["candidate"]


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        _winner(record)[field] = value

    return edit


def _top(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        record[field] = value

    return edit


def _row(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        record["candidates"][1][field] = value

    return edit


# each edit spoils the winner's row: the next best (ddp ×2, 200) is applied, or auto's choice
SPOILED_ROW = [
    ("strategy injected", _set("strategy", "ddp train.lr=100")),
    ("strategy tp", _set("strategy", "tp")),
    ("strategy not text", _set("strategy", ["ddp"])),
    ("micro-batch -1", _set("micro_batch", -1)),
    ("micro-batch 0", _set("micro_batch", 0)),
    ("micro-batch 1.5", _set("micro_batch", 1.5)),
    ("micro-batch text", _set("micro_batch", "8")),
    ("micro-batch bool", _set("micro_batch", True)),
    ("micro-batch huge", _set("micro_batch", 10**30)),
    ("global batch broken", _set("grad_accum", 4)),
    ("ranks 0", _set("ranks", 0)),
    ("ranks huge", _set("ranks", 10**9)),
    ("none on 2 ranks", _set("ranks", 2)),
    ("threads 0", _set("threads", 0)),
    ("workers -1", _set("num_workers", -1)),
    ("compile text", _set("compile", "yes")),
    ("checkpointing unknown", _set("activation_checkpointing", "offload")),
    ("candidate not an object", _row("candidate", "none ×1")),
    ("status other", _row("status", "OK")),
    ("figure NaN", _row("samples_per_s", math.nan)),
    ("figure infinite", _row("samples_per_s", math.inf)),
    ("figure negative", _row("samples_per_s", -5.0)),
    ("figure text", _row("samples_per_s", "9999")),
    ("figure bool", _row("samples_per_s", True)),
]


@pytest.mark.parametrize("edit", [e for _, e in SPOILED_ROW], ids=[n for n, _ in SPOILED_ROW])
def test_a_spoiled_winner_row_is_passed_over_for_the_next_valid_one(tmp_path: Path, edit: Callable) -> None:
    record = _good()
    edit(record)
    tuned = _resolve(tmp_path, record)
    assert tuned.applied and tuned.ranks == 2 and "parallel.strategy=ddp" in tuned.overrides, tuned.line
    assert not [o for o in tuned.overrides if "train.lr" in o]


def _lines(n: int) -> Callable[[dict[str, Any]], None]:
    def edit(record: dict[str, Any]) -> None:
        for row in record["candidates"]:
            row["status"] = "failed"

    return edit


WHOLE_RECORD: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("machine fingerprint other", _top("machine_fingerprint", "0" * 16), "another machine"),
    ("machine fingerprint null", _top("machine_fingerprint", None), "another machine"),
    (
        "machine name escape codes",
        lambda r: r.update(machine_fingerprint="x", machine={"name": "\x1b[2J\x07evil"}),
        "another machine",
    ),
    ("config fingerprint other", _top("config_fingerprint", "f" * 16), "the config changed"),
    (
        "config fields not an object",
        lambda r: r.update(config_fingerprint="x", config_fields=[1]),
        "the config changed since the tune; running",
    ),
    ("candidates not a list", _top("candidates", {"0": 1}), "no candidates"),
    ("nothing ran", _lines(0), "measured no layout"),
    ("candidates empty", _top("candidates", []), "measured no layout"),
]


@pytest.mark.parametrize(("edit", "said"), [(e, s) for _, e, s in WHOLE_RECORD], ids=[n for n, _, _ in WHOLE_RECORD])
def test_a_record_for_another_machine_or_config_or_without_a_winner_runs_autos_choice(
    tmp_path: Path, edit: Callable, said: str
) -> None:
    record = _good()
    edit(record)
    tuned = _resolve(tmp_path, record)
    _is_fallback(tuned, said)


FILES: list[tuple[str, Callable[[Path], None], str]] = [
    ("not JSON", lambda p: p.write_text("{nope"), "not valid JSON"),
    ("not UTF-8", lambda p: p.write_bytes(b"\xff\xfe{}"), "not UTF-8"),
    ("empty", lambda p: p.write_text(""), "not valid JSON"),
    ("a list", lambda p: p.write_text("[1, 2]"), "not a tune record"),
    ("nested deeply", lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "nested too deeply"),
    ("a huge number", lambda p: p.write_text('{"winner": ' + "9" * 5000 + "}"), "too long"),
    ("too big", lambda p: p.write_text(" " * (5 << 20) + "{}"), "tune.json"),
    ("a directory named tune.json", lambda p: p.mkdir(), "tune.json"),
    ("a FIFO", lambda p: os.mkfifo(p), "tune.json"),
    ("a link out of its folder", lambda p: p.symlink_to("/etc/hostname"), "tune.json"),
]


@pytest.mark.parametrize(("make", "said"), [(m, s) for _, m, s in FILES], ids=[n for n, _, _ in FILES])
def test_an_unreadable_tune_file_runs_autos_choice_and_says_why(tmp_path: Path, make: Callable, said: str) -> None:
    folder = tmp_path / "tune"
    folder.mkdir()
    make(folder / TUNE)
    _is_fallback(_tuned(folder / TUNE), said)


def test_the_files_own_override_text_is_never_passed_on(tmp_path: Path) -> None:
    record = _good()
    record["candidates"][1]["overrides"] = ["optim.lr=100", "train.device=cuda"]
    record["candidates"][1]["label"] = "evil\nsecond line"
    tuned = _resolve(tmp_path, record)
    assert tuned.applied and tuned.overrides == Candidate(1, "none", 8, 2, threads=2).overrides()
    assert "\n" not in tuned.line and "evil" not in tuned.line


def _resolve(tmp_path: Path, record: dict[str, Any]):
    folder = tmp_path / "tune"
    folder.mkdir(exist_ok=True)
    (folder / TUNE).write_text(json.dumps(record))
    return _tuned(folder)


def _tuned(path: Path):
    return resolve_tuned(
        load_config(None, [*JOB, "parallel.strategy=tuned", f"parallel.tune_file={path}"]), MACHINE, None
    )


def _is_fallback(tuned: Any, said: str) -> None:
    assert not tuned.applied and tuned.overrides == ["parallel.strategy=auto"] and tuned.ranks is None
    assert said in tuned.line and tuned.line.endswith("; running auto's choice"), tuned.line
    assert tuned.line.isprintable() and "\n" not in tuned.line


# ----------------------------------------------------------------- the report's table

INJECTED = [
    ("label", "<script>alert(1)</script>"),
    ("reason", "<img src=x onerror=alert(1)>"),
    ("status", "ok</td><script>x</script>"),
]


@pytest.mark.parametrize(("field", "text"), INJECTED, ids=[f for f, _ in INJECTED])
def test_the_reports_tune_table_escapes_what_the_file_holds(tmp_path: Path, field: str, text: str) -> None:
    record = copy.deepcopy(_good())
    record["candidates"][0][field] = text
    record["machine"] = {"name": "<b>cpu</b>"}
    folder = tmp_path / "tune"
    folder.mkdir()
    (folder / TUNE).write_text(json.dumps(record))
    html = tune_html(read_run(folder))
    assert "<script>" not in html and "<img" not in html and "<b>cpu" not in html
    assert "&lt;" in html
