"""`gputrain sweep` given bad input (issue 32): a space, an option, a storage, a study or a sweep
directory that cannot be. Each is refused in one line naming the file, key or option, exit 2,
before any trial starts (no trial's run directory exists after it); a storage's password never
shows in the line."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gputrain.cli import main

pytest.importorskip("optuna", reason="gputrain sweep needs the optuna extra (pip install gputrain[optuna])")

BASE = """
[base]
model.name = "mlp"
data.name = "digits"
train.max_steps = 2
eval.every_steps = 1
"""
GOOD = "optim.lr = {log_uniform = [1e-4, 1e-2]}\ntrain.batch_size = {choice = [32, 64]}\n" + BASE

# (case id, space file text or None for GOOD, extra command-line words, words the one line must hold)
CASES: list[tuple[str, str | None, list[str], list[str]]] = [
    ("unknown key", "optim.lrr = {log_uniform = [1e-4, 1e-2]}" + BASE, [], ["space.toml", "optim.lrr"]),
    ("unknown section", "optimiser.lr = {uniform = [0.1, 0.2]}" + BASE, [], ["space.toml", "optimiser"]),
    ("key too deep", '"optim.lr.x" = {uniform = [0.1, 0.2]}' + BASE, [], ["space.toml", "optim.lr.x"]),
    ("empty range", "optim.lr = {uniform = [0.1, 0.1]}" + BASE, [], ["optim.lr", "empty"]),
    ("inverted range", "optim.lr = {log_uniform = [1e-2, 1e-4]}" + BASE, [], ["optim.lr", "empty"]),
    ("log of zero", "optim.lr = {log_uniform = [0, 1e-2]}" + BASE, [], ["optim.lr", "low > 0"]),
    ("infinite bound", "optim.lr = {uniform = [0.1, inf]}" + BASE, [], ["optim.lr", "finite"]),
    ("nan bound", "optim.lr = {uniform = [nan, 0.1]}" + BASE, [], ["optim.lr", "finite"]),
    ("boolean bound", "optim.lr = {uniform = [false, 0.1]}" + BASE, [], ["optim.lr", "[low, high]"]),
    ("one bound", "optim.lr = {uniform = [0.1]}" + BASE, [], ["optim.lr", "[low, high]"]),
    ("three bounds", "optim.lr = {uniform = [0.1, 0.2, 0.3]}" + BASE, [], ["optim.lr", "[low, high]"]),
    ("int of floats", "train.batch_size = {int = [8.0, 64]}" + BASE, [], ["train.batch_size", "whole"]),
    ("empty choice", "train.batch_size = {choice = []}" + BASE, [], ["train.batch_size", "empty"]),
    ("choice twice", "train.batch_size = {choice = [32, 32]}" + BASE, [], ["train.batch_size", "twice"]),
    ("choice of lists", "optim.betas = {choice = [[0.9, 0.95]]}" + BASE, [], ["optim.betas", "booleans"]),
    ("two kinds", "optim.lr = {uniform = [0.1, 0.2], choice = [0.1]}" + BASE, [], ["optim.lr", "one distribution"]),
    ("unknown kind", "optim.lr = {normal = [0.1, 0.2]}" + BASE, [], ["optim.lr", "log_uniform"]),
    ("a bare value", "optim.lr = 0.1" + BASE, [], ["optim.lr", "one distribution"]),
    ("kind not a list", "optim.lr = {choice = 0.1}" + BASE, [], ["optim.lr", "list"]),
    ("float range for int key", "train.batch_size = {uniform = [16, 128]}" + BASE, [], ["train.batch_size"]),
    ("text for int key", 'train.batch_size = {choice = [32, "big"]}' + BASE, [], ["train.batch_size", "big"]),
    ("below the key's range", "optim.lr = {uniform = [-1.0, 0.1]}" + BASE, [], ["optim.lr = -1.0"]),
    ("int below the key's range", "train.epochs = {int = [0, 3]}" + BASE, [], ["train.epochs = 0"]),
    ("unknown choice", 'model.activation = {choice = ["auto", "nope"]}' + BASE, [], ["model.activation", "nope"]),
    ("no parameter", BASE, [], ["space.toml", "no parameter"]),
    ("base not a table", "base = 3\noptim.lr = {choice = [0.1]}", [], ["[base]"]),
    ("base unknown key", "optim.lr = {choice = [0.1]}" + BASE + "train.epochz = 1\n", [], ["[base]", "epochz"]),
    ("base bad value", "optim.lr = {choice = [0.1]}" + BASE + "train.epochs = -1\n", [], ["[base]", "train.epochs"]),
    ("searched and fixed", "optim.lr = {choice = [0.1]}" + BASE + "optim.lr = 0.2\n", [], ["optim.lr", "both"]),
    ("given twice", 'optim.lr = {choice = [0.1]}\n"optim.lr" = {choice = [0.2]}' + BASE, [], ["optim.lr", "twice"]),
    ("not TOML", "optim.lr = {choice = [0.1\n", [], ["space.toml", "TOML"]),
    ("override of a searched key", None, ["optim.lr=0.1"], ["optim.lr", "searched"]),
    ("metric not logged", None, ["--metric", "perplexity"], ["--metric perplexity", "accuracy"]),
    ("metric not listed", None, ['eval.metrics=["accuracy"]', "--metric", "f1"], ["--metric f1"]),
    ("val_ metric not logged", None, ["--metric", "val_mse"], ["--metric mse"]),
    ("never validates", None, ["eval.every_steps=0", "eval.every_epochs=0"], ["never validate"]),
    ("storage dir missing", None, ["--storage", "sqlite:////no/such/dir/x.db"], ["--storage", "cannot be opened"]),
    ("storage dialect unknown", None, ["--storage", "nosuchdb://h/x"], ["--storage", "cannot be opened"]),
    ("storage not a URL", None, ["--storage", "not a url"], ["--storage", "cannot be opened"]),
    ("storage empty", None, ["--storage", ""], ["--storage"]),
    ("grid over a float range", None, ["--sampler", "grid"], ["--sampler grid", "optim.lr"]),
    ("no trials", None, ["--trials", "0"], ["--trials"]),
    ("negative warmup", None, ["--prune-warmup", "-1"], ["--prune-warmup"]),
    ("several nodes", None, ["--nnodes", "2"], ["--nnodes"]),
    ("a node rank", None, ["--node-rank", "1"], ["--node-rank"]),
    ("an endpoint", None, ["--rdzv-endpoint", "localhost:29500"], ["--rdzv-endpoint"]),
    ("unknown sampler", None, ["--sampler", "cmaes"], ["--sampler"]),
    ("unknown override key", None, ["train.epochz=1"], ["train.epochz"]),
    ("study name a path", None, ["--study", "../../etc"], ["--study", "letters, digits"]),
    ("study name hidden", None, ["--study", ".hidden"], ["--study"]),
    ("study name empty", None, ["--study", ""], ["--study"]),
    ("study name with a newline", None, ["--study", "a\nb"], ["--study"]),
]


def _refused(capsys: pytest.CaptureFixture[str], cwd: Path, argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    err = capsys.readouterr().err
    line = err.strip()
    assert code == 2, (code, err)
    assert "Traceback" not in err and len(line.splitlines()) == 1, err
    assert not list(cwd.rglob("trial-*")), "a trial started"
    return line


@pytest.mark.parametrize(("text", "extra", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_before_any_trial(
    text: str | None,
    extra: list[str],
    words: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.toml").write_text(GOOD if text is None else text)
    # one short trial at most, should a refusal ever go missing (the check that no trial started fails)
    line = _refused(capsys, tmp_path, ["sweep", "space.toml", "--trials", "1", *extra])
    for word in words:
        assert word in line, (word, line)


def test_missing_space_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert "nope.toml" in _refused(capsys, tmp_path, ["sweep", "nope.toml"])


def test_a_storage_password_stays_out_of_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.toml").write_text(GOOD)
    url = "postgresql://user:s3cr3t-word@127.0.0.1:1/db"
    line = _refused(capsys, tmp_path, ["sweep", "space.toml", "--storage", url])
    assert "--storage" in line and "s3cr3t-word" not in line


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: d.write_text("a file"), ["not a directory"]),
        (lambda d: (d.mkdir(), (d / "config.toml").write_text("")), ["a run's directory"]),
        (lambda d: (d.mkdir(), (d / "notes.txt").write_text("mine")), ["holds other files"]),
        (lambda d: (d.mkdir(), (d / "sweep.json").write_text('{"study": "other"}')), ["holds study 'other'"]),
        (lambda d: d.symlink_to(d.parent), ["not a directory"]),
    ],
    ids=["a file", "a run directory", "a folder of other files", "another study's", "a link"],
)
def test_a_sweep_directory_that_is_not_this_sweeps(
    make, words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.toml").write_text(GOOD)
    make(tmp_path / "sw")
    line = _refused(capsys, tmp_path, ["sweep", "space.toml", "--sweep-dir", "sw"])
    for word in words:
        assert word in line, (word, line)


@pytest.mark.parametrize(
    ("second", "words"),
    [
        (["--direction", "maximize"], ["--study space"]),
        (["--metric", "accuracy", "--direction", "minimize"], ["--study space", "metric"]),
        (["--objective", "best"], ["--study space", "objective"]),
        (["train.max_steps=3"], ["--study space", "fixed"]),
        (["--pruner", "none"], ["--study space", "pruner"]),
    ],
    ids=["another direction", "another metric", "another objective", "other fixed values", "another pruner"],
)
def test_joining_a_study_with_other_settings(
    second: list[str],
    words: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.toml").write_text(GOOD)
    assert main(["sweep", "space.toml", "--show"]) == 0  # creates the study, runs nothing
    capsys.readouterr()
    line = _refused(capsys, tmp_path, ["sweep", "space.toml", *second])
    for word in words:
        assert word in line, (word, line)
    with sqlite3.connect(tmp_path / "runs" / "sweep-space" / "study.db") as db:
        assert db.execute("select count(*) from trials").fetchone() == (0,)
