"""run/reader.py: a run file is read only where it is a regular file inside the run directory (links
followed, a linked parent folder included), within its size bound, as JSON without trust, in the
shape its readers use."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from gputrain.errors import DataError
from gputrain.run import reader, shapes
from gputrain.run.reader import (
    INT,
    NUMBER,
    OBJECT,
    TEXT,
    RunFileError,
    Shape,
    iter_lines,
    parse_json,
    read_bytes,
    read_json,
    read_tail,
    run_entry,
)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"status": "completed", "global_step": 8}))
    return path


def test_a_regular_file_and_a_link_inside_are_read(run_dir: Path) -> None:
    assert json.loads(read_bytes(run_dir, "summary.json") or b"") == {"status": "completed", "global_step": 8}
    os.symlink("summary.json", run_dir / "alias.json")
    assert read_bytes(run_dir, "alias.json") == read_bytes(run_dir, "summary.json")
    assert read_bytes(run_dir, "absent.json") is None
    os.symlink("nowhere.json", run_dir / "dangling.json")
    assert read_bytes(run_dir, "dangling.json") is None  # a link to nothing: nothing to read


def test_a_run_directory_reached_through_a_link_is_read(run_dir: Path, tmp_path: Path) -> None:
    os.symlink(run_dir, tmp_path / "linked-run")
    assert read_bytes(tmp_path / "linked-run", "summary.json") == read_bytes(run_dir, "summary.json")


@pytest.mark.parametrize("how", ["absolute", "relative", "via-linked-parent", "chain"])
def test_a_link_leading_out_is_refused_naming_it(run_dir: Path, tmp_path: Path, how: str) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"status": "SECRET"}')
    link = run_dir / "summary.json"
    link.unlink()
    if how == "absolute":
        os.symlink(secret, link)
    elif how == "relative":
        os.symlink("../secret.json", link)
    elif how == "via-linked-parent":  # each link alone looks harmless: sub/ is a folder, the file is inside it
        os.symlink(tmp_path, run_dir / "sub")
        os.symlink("sub/secret.json", link)
    else:  # a link inside, to a link out
        os.symlink(secret, run_dir / "inner.json")
        os.symlink("inner.json", link)
    with pytest.raises(RunFileError) as err:
        read_bytes(run_dir, "summary.json")
    message = str(err.value)
    assert message.startswith(f"{link}: a symbolic link leading out of the run directory (to {secret})")
    assert "SECRET" not in message and len(message.splitlines()) == 1
    assert isinstance(err.value, DataError)  # exit 2 where a command cannot go on


def test_a_device_behind_a_link_is_refused(run_dir: Path) -> None:
    os.symlink("/dev/null", run_dir / "env.json")
    with pytest.raises(RunFileError, match="leading out of the run directory"):
        read_bytes(run_dir, "env.json")


def test_a_loop_of_links_is_refused(run_dir: Path) -> None:
    os.symlink("b.json", run_dir / "a.json")
    os.symlink("a.json", run_dir / "b.json")
    with pytest.raises(RunFileError, match=r"a\.json: a loop of symbolic links"):
        read_bytes(run_dir, "a.json")


def test_a_fifo_is_refused_without_opening_it(run_dir: Path) -> None:
    os.mkfifo(run_dir / "metrics.jsonl")
    with pytest.raises(RunFileError, match=r"metrics\.jsonl: is a FIFO \(named pipe\), where a run keeps a regular"):
        list(iter_lines(run_dir, "metrics.jsonl"))
    with pytest.raises(RunFileError, match="FIFO"):
        read_tail(run_dir, "metrics.jsonl")


def test_a_fifo_swapped_in_after_the_check_does_not_block(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is opened without blocking and judged by what was opened: a FIFO that took the
    checked file's place is refused, not waited on (no writer ever comes)."""
    os.mkfifo(run_dir / "pipe")
    monkeypatch.setattr(reader, "run_entry", lambda run_dir, name, directory=False: run_dir / "pipe")
    with pytest.raises(RunFileError, match="is a FIFO"):
        read_bytes(run_dir, "summary.json")


def test_a_folder_where_a_file_belongs_is_refused(run_dir: Path) -> None:
    (run_dir / "env.json").mkdir()
    with pytest.raises(RunFileError, match=r"env\.json: is a directory, where a run keeps a regular file"):
        read_bytes(run_dir, "env.json")
    assert run_entry(run_dir, "env.json", directory=True) == (run_dir / "env.json").resolve()


def test_a_file_over_its_kinds_bound_is_refused_naming_both(run_dir: Path) -> None:
    with open(run_dir / "summary.json", "r+b") as f:
        f.truncate(1 << 30)  # sparse
    with pytest.raises(RunFileError) as err:
        read_bytes(run_dir, "summary.json")
    assert str(err.value) == f"{run_dir / 'summary.json'}: 1024 MB, over the 4 MB a summary.json of a run holds"
    assert reader.limit_for("profile-rank3.json") == reader.LIMITS["profile"]
    assert reader.limit_for("scores-val.npz") == reader.LIMITS["scores"]


def test_metrics_lines_are_streamed_and_an_overlong_one_is_skipped(run_dir: Path) -> None:
    rows = [b'{"step": 1}\n', b'{"pad": "' + b"x" * 5000 + b'"}\n', b'{"step": 2}\n', b'{"step": 3}']
    (run_dir / "metrics.jsonl").write_bytes(b"".join(rows))
    assert list(iter_lines(run_dir, "metrics.jsonl", max_line=100)) == [rows[0], None, rows[2], rows[3]]
    assert list(iter_lines(run_dir, "absent.jsonl")) == []


def test_a_logs_tail_is_its_last_bytes(run_dir: Path) -> None:
    (run_dir / "error.log").write_text("a" * 1000 + "\nlast line\n")
    assert read_tail(run_dir, "error.log", size=10) == "last line\n"
    assert read_tail(run_dir, "absent.log") is None


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("1" * 5000, "holds a number too long"),
        ("{not json", "not valid JSON (Expecting property name enclosed in double quotes at line 1)"),
        (b"\xff\xfe{}", "not UTF-8 text"),
        ("", "not valid JSON (Expecting value at line 1)"),
    ],
    ids=["deep", "long-int", "broken", "utf16", "empty"],
)
def test_json_that_python_cannot_hold_is_one_line(text: str | bytes, said: str) -> None:
    with pytest.raises(RunFileError) as err:
        parse_json(text, "run/x.json")
    assert str(err.value).startswith(f"run/x.json: {said}")


def test_json_nan_is_read_as_gputrain_writes_a_diverged_loss() -> None:
    assert math.isnan(parse_json('{"loss": NaN}', "x")["loss"])


SHAPE = Shape(
    {"step": INT, "loss": NUMBER, "name": TEXT, "inner": OBJECT},
    required=("step",),
    nested={"inner": Shape({"n": INT})},
)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ('"8"', "'8'"),
        ("true", "True"),
        ("8.5", "8.5"),
        ("1" + "0" * 400, "a number of 401 digits"),
        ("[1, 2]", "a list of 2"),
        ('{"a": 1}', "an object of 1"),
        ("NaN", "nan"),
    ],
)
def test_a_required_field_of_a_wrong_kind_refuses_the_file(run_dir: Path, value: str, said: str) -> None:
    (run_dir / "x.json").write_text(f'{{"step": {value}}}')
    with pytest.raises(RunFileError) as err:
        read_json(run_dir, "x.json", SHAPE, notes=[])
    assert str(err.value) == f"{run_dir / 'x.json'}: step is {said}; an integer is right"


def test_other_fields_of_a_wrong_kind_are_left_out_and_noted(run_dir: Path) -> None:
    (run_dir / "x.json").write_text('{"step": 3, "loss": "low", "name": 5, "inner": {"n": "x"}, "extra": [1]}')
    notes: list[str] = []
    assert read_json(run_dir, "x.json", SHAPE, notes) == {"step": 3, "inner": {}, "extra": [1]}
    where = run_dir / "x.json"
    assert notes == [
        f"{where}: loss is 'low'; a number is right; left out",
        f"{where}: name is 5; text is right; left out",
        f"{where}: inner: n is 'x'; an integer is right; left out",
    ]
    with pytest.raises(RunFileError, match=r"loss is 'low'; a number is right$"):
        read_json(run_dir, "x.json", SHAPE)  # without notes: refused


def test_a_file_that_is_not_an_object_or_lacks_a_required_field(run_dir: Path) -> None:
    (run_dir / "x.json").write_text("[1, 2, 3]")
    with pytest.raises(RunFileError, match=r"x\.json: holds a list of 3, where an object \{...\} is right"):
        read_json(run_dir, "x.json", SHAPE, [])
    (run_dir / "x.json").write_text('{"loss": 1}')
    with pytest.raises(RunFileError, match=r"x\.json: has no field 'step' \(an integer\)"):
        read_json(run_dir, "x.json", SHAPE, [])


def test_many_bad_fields_are_a_few_notes(run_dir: Path) -> None:
    ops = [{"name": i, "calls": "many"} for i in range(1000)]
    (run_dir / "profile.json").write_text(json.dumps({"top_host_ops": ops}))
    notes: list[str] = []
    record = read_json(run_dir, "profile.json", shapes.PROFILE, notes)
    assert record is not None and record["top_host_ops"][0] == {}
    assert len(notes) == reader.NOTES_PER_FILE + 1 and notes[-1].endswith("1995 more field(s) of a wrong kind left out")


def test_the_summary_gputrain_writes_passes_its_shape(tmp_path: Path) -> None:
    from tests.adversarial.helpers import linear_trainer

    run = tmp_path / "run"
    linear_trainer(run, **{"train.epochs": 1}).fit()
    notes: list[str] = []
    assert read_json(run, "summary.json", shapes.SUMMARY, notes) == json.loads((run / "summary.json").read_text())
    assert read_json(run, "env.json", shapes.ENV, notes) is not None
    assert notes == []

