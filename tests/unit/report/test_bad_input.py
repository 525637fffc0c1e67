"""Bad input to `gputrain report`: one short line naming the directory and what is missing or
wrong, exit 2, nothing written."""

from __future__ import annotations

import shutil

import pytest

from gputrain.cli import main


def _fails(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["report", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    return err


def test_a_directory_that_is_not_a_run_names_what_is_missing(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    err = _fails(capsys, str(tmp_path))
    assert err == (f"gputrain report: {tmp_path}: not a run directory: it has no config.toml, metrics.jsonl, "
                   "summary.json, lr_find.json or tune.json (gputrain train writes them into its --run-dir)")
    assert not (tmp_path / "report.html").exists()


def test_a_missing_directory_and_a_file(tmp_path, capsys):
    assert _fails(capsys, str(tmp_path / "nope")).endswith("nope: no such directory")
    (tmp_path / "f").write_text("")
    assert "not a directory" in _fails(capsys, str(tmp_path / "f"))


def test_a_run_with_no_metrics_yet(tmp_path, capsys):
    (tmp_path / "config.toml").write_text("[log]\nevery_steps = 50\n")
    err = _fails(capsys, str(tmp_path))
    assert err == (f"gputrain report: {tmp_path}: no metrics yet: metrics.jsonl does not exist yet; the run logs "
                   "its first row after log.every_steps=50 steps, so run gputrain report again then")
    (tmp_path / "metrics.jsonl").write_text("")
    assert "metrics.jsonl is empty" in _fails(capsys, str(tmp_path))


def test_one_run_without_metrics_stops_a_comparison(completed_run, tmp_path, capsys):
    empty = tmp_path / "starting"
    empty.mkdir()
    (empty / "config.toml").write_text("")
    assert "starting: no metrics yet" in _fails(capsys, str(completed_run[0]), str(empty), "-o", str(tmp_path / "c.html"))
    assert not (tmp_path / "c.html").exists()


def test_the_same_run_twice_and_an_output_that_is_a_directory(completed_run, tmp_path, capsys):
    run = str(completed_run[0])
    assert "given twice" in _fails(capsys, run, run)
    assert "is a directory" in _fails(capsys, run, "-o", str(tmp_path))


def test_an_unreadable_file_is_a_note_not_a_failure(completed_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(completed_run[0], run_dir)
    (run_dir / "env.json").write_text("{not json")
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "note: run: env.json: not valid JSON (Expecting property name enclosed in double quotes at line 1); " \
        "left out" in out
    assert "env.json: not valid JSON" in (run_dir / "report.html").read_text()


def test_the_reports_columns_keep_a_bounded_number_of_fields() -> None:
    from gputrain.report.rundir import MAX_FIELDS, Columns

    columns = Columns()
    for i in range(3 * MAX_FIELDS):
        columns.add({"step": i, f"made-up-{i}": 1.0})
    assert len(columns.keys()) == MAX_FIELDS and columns.count == 3 * MAX_FIELDS
    assert columns.last("step") == 3 * MAX_FIELDS - 1
