"""run/output.py: the one check and writer of every command's outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gputrain.errors import UsageError
from gputrain.run.output import (
    Owner,
    atomic,
    check_output_file,
    check_output_folder,
    holds_a_run,
    is_rl_run,
    json_record,
    marked,
    never,
)

OURS = json_record("test", "a", "b")


def _run(path: Path, **files: str) -> Path:
    """A directory holding a run: its config and machine facts, and `files`."""
    path.mkdir(parents=True)
    (path / "config.toml").write_text("[model]\n")
    (path / "env.json").write_text("{}")
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text)
    return path


def _refused(given: str | Path, owner: Owner | None = None, ours=OURS, **kw) -> str:
    with pytest.raises(UsageError) as err:
        check_output_file(given, "-o", owner or Owner(), ours, **kw)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"-o {given}")
    return message


def test_a_new_file_in_a_new_folder_is_taken(tmp_path: Path) -> None:
    assert check_output_file(tmp_path / "a" / "b.csv", "-o", Owner(), OURS) == tmp_path / "a" / "b.csv"


def test_dash_is_standard_output_only_where_the_command_writes_one_file(tmp_path: Path) -> None:
    assert check_output_file("-", "-o", Owner(), OURS, stdout=True) is None
    assert "not standard output" in _refused("-")


def test_links_are_never_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("keep")
    (tmp_path / "link").symlink_to(outside)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "out").symlink_to("/dev/stdout")
    assert "symbolic link" in _refused(tmp_path / "link")
    assert "symbolic link" in _refused(tmp_path / "dangling")
    assert "or - for standard output" in _refused(tmp_path / "out", stdout=True)
    assert outside.read_text() == "keep" and not (tmp_path / "nowhere").exists()


def test_a_device_a_fifo_or_a_folder_is_not_a_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert "a FIFO" in _refused(tmp_path / "fifo")
    assert "a device" in _refused("/dev/null")
    assert "is a directory" in _refused(tmp_path)


def test_a_file_gputrain_did_not_write_is_kept_and_its_own_replaced(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs.json"
    theirs.write_text('{"a": 1}')
    assert "did not write" in _refused(theirs)
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(marked("test")))
    assert check_output_file(mine, "-o", Owner(), OURS) == mine
    old = tmp_path / "old.json"
    old.write_text('{"a": 1, "b": 2}')  # written before the marker: known by its keys
    assert check_output_file(old, "-o", Owner(), OURS) == old
    assert "did not write" in _refused(mine, ours=never)


def test_an_input_is_never_an_output_by_any_name(tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_text("x\n1\n")
    os.link(data, tmp_path / "hard.csv")
    folder = tmp_path / "images"
    folder.mkdir()
    owner = Owner.of(inputs=[data, folder, None])
    for given in (data, tmp_path / "hard.csv", tmp_path / "." / "data.csv"):
        assert "which this command reads" in _refused(given, owner, ours=lambda p: True)
    assert "inside" in _refused(folder / "preds.csv", owner)


def test_a_run_directory_takes_only_what_the_command_designates_there(tmp_path: Path) -> None:
    own = _run(tmp_path / "own")
    (own / "checkpoints" / "step-1").mkdir(parents=True)
    other = _run(tmp_path / "other")
    owner = Owner.of(runs=[own], designated=["eval-*.json", "export/*"])
    assert check_output_file(own / "eval-x.json", "-o", owner, OURS) == own / "eval-x.json"
    assert check_output_file(own / "export" / "pt2", "-o", owner, OURS) is not None
    assert check_output_file(own / "notes.csv", "-o", owner, OURS) is not None  # a name of the user's own
    assert check_output_file(own / "mine" / "eval-x.json", "-o", owner, OURS) is not None  # in a folder of theirs
    for name in ("config.toml", "model.safetensors", "scores-test.npz", "summary.json", "checkpoints/step-1/x"):
        assert "never writes over" in _refused(own / name, owner, ours=lambda p: True)
    for name in ("eval-x.json", "preds.csv", "sub/preds.csv"):
        assert "another run's files" in _refused(other / name, owner)


def test_no_link_leads_out_of_the_commands_own_run(tmp_path: Path) -> None:
    own = _run(tmp_path / "own")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (own / "export").symlink_to(elsewhere)
    owner = Owner.of(runs=[own], designated=["export/*"])
    assert "leads out of the run directory" in _refused(own / "export" / "pt2", owner)


def test_a_path_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert "Not a directory" in _refused(tmp_path / "file" / "out.csv")
    assert "cannot be written" in _refused(tmp_path / ("x" * 300))


def test_what_holds_a_run(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.toml").write_text("")
    assert not holds_a_run(project)  # a project's own config is not a run
    assert holds_a_run(_run(tmp_path / "run"))
    for name in ("summary.json", "metrics.jsonl", "lr_find.json", "export.json", "COMMITTED"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_text("")
        assert holds_a_run(folder), name


def test_an_rl_run_is_told_by_its_summary_or_its_rows(tmp_path: Path) -> None:
    assert is_rl_run(_run(tmp_path / "a", summary__json=json.dumps({"rl": {}})))
    assert is_rl_run(_run(tmp_path / "b", metrics__jsonl='{"env_steps": 8}\n'))
    assert not is_rl_run(_run(tmp_path / "c", summary__json='{"status": "completed"}', metrics__jsonl='{"step": 1}'))


def test_a_folder_is_new_empty_or_the_commands_own(tmp_path: Path) -> None:
    owner = Owner()
    assert check_output_folder(tmp_path / "new", "-o", owner, never) == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert check_output_folder(tmp_path / "empty", "-o", owner, never) == tmp_path / "empty"
    user = tmp_path / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("keep")
    with pytest.raises(UsageError, match=r"did not write there \(thesis\.tex\)"):
        check_output_folder(user, "-o", owner, never)
    assert check_output_folder(user, "-o", owner, lambda p: True) == user
    with pytest.raises(UsageError, match="another run's files"):
        check_output_folder(_run(tmp_path / "run") / "out", "-o", owner, never)
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(UsageError, match="symbolic link"):
        check_output_folder(tmp_path / "link", "-o", owner, never)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.npz"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic(path) as tmp:
        assert tmp.suffix == ".npz" and tmp.parent == tmp_path
        tmp.write_text("half")
        raise RuntimeError("cut")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.npz"]
    with atomic(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["out.npz"]


@pytest.mark.parametrize("writer", ["atomic", "write_text"])
def test_a_link_planted_under_a_guessable_temporary_name_is_not_written_through(tmp_path: Path, writer: str) -> None:
    """Another user of a shared folder plants links under the names a writer could pick from its
    process id; the writer's temporary name is not among them, so the target stays as it was."""
    from gputrain.run.files import write_text
    from gputrain.run.output import atomic

    target = tmp_path / "victim.txt"
    target.write_text("theirs")
    out = tmp_path / "shared" / "out.csv"
    out.parent.mkdir()
    pid = os.getpid()
    for guess in (f".out.tmp-{pid}.csv", f".out.csv.tmp-{pid}", f".out.tmp-{pid}", f".out.csv.tmp-{pid}.csv"):
        (out.parent / guess).symlink_to(target)
    if writer == "atomic":
        with atomic(out) as tmp:
            tmp.write_text("ours")
    else:
        write_text(out, "ours")
    assert out.read_text() == "ours" and not out.is_symlink()
    assert target.read_text() == "theirs"
