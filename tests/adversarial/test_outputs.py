"""Every command's outputs go through one writer (run/output.py): a hostile or careless output path —
the command's own input, a run's own files, another run's directory, a user's file or folder, a link,
a device or a FIFO — is refused before any work, in one line naming the option and the path (exit 2),
and what was there keeps every byte. And the outputs a command owns are written again as asked.

One tiny trained run on CSV rows is shared by every case (the refusals write nothing into it); the
cases that write work on a copy of it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gputrain.cli import main
from tests.unit.use.conftest import COMMON, write_table

CSV_RUN = [
    "model.name=mlp",
    "model.hidden_sizes=[8]",
    "data.name=csv",
    "data.label_column=label",
    "train.epochs=2",
    "train.batch_size=16",
    "checkpoint.every_steps=5",
]


@dataclass(frozen=True)
class World:
    run: Path
    """A trained run (CSV rows), with checkpoints."""
    other: Path
    """Another run: a copy of `run`."""
    rl: Path
    """A directory holding a gputrain rl run (its config, machine facts and summary)."""
    table: Path
    """The run's training CSV."""
    rows: Path
    """New rows to predict."""

    @property
    def checkpoint(self) -> Path:
        return sorted((self.run / "checkpoints").glob("step-*"))[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    import torch

    from gputrain.train.trainer import Trainer

    root = tmp_path_factory.mktemp("outputs")
    (root / "data").mkdir()
    table = write_table(root / "data" / "table.csv", rows=96)
    run = root / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            Trainer.from_config(None, run_dir=run, overrides=[*CSV_RUN, f"data.path={table}", *COMMON]).fit()
    finally:
        torch.set_num_threads(threads)
    other = root / "other"
    shutil.copytree(run, other)
    rl = root / "rl"
    rl.mkdir()
    (rl / "config.toml").write_text((run / "config.toml").read_text())
    (rl / "env.json").write_text("{}")
    (rl / "summary.json").write_text(json.dumps({"status": "completed", "global_step": 4, "rl": {"episodes": 3}}))
    rows = root / "rows.csv"
    rows.write_text("".join(table.read_text().splitlines(keepends=True)[:6]))
    return World(run, other, rl, table, rows)


def _state(path: Path) -> dict[str, str]:
    """Every byte under `path` (a file, a folder or what a link leads to; a FIFO or device by kind only)."""
    if os.path.islink(path) and not path.exists():
        return {"link": os.readlink(path)}
    if path.is_dir():
        return {
            str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*"))
            if p.is_file()
        }
    if path.is_file():
        return {"": hashlib.sha256(path.read_bytes()).hexdigest()}
    if path in _FIFOS:
        return {"kind": str(os.lstat(path).st_mode), "written": _written_into(path).hex()}
    return {"kind": str(os.lstat(path).st_mode) if os.path.lexists(path) else "absent"}


def _refused(capsys: pytest.CaptureFixture[str], args: list[str], option: str, given: Path, watched: Path) -> str:
    before = _state(watched)
    code = main(args)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert option in err and str(given) in err, err
    assert _state(watched) == before
    return err


# ----------------------------------------------------------------- hostile targets

Target = Callable[[World, Path], tuple[Path, Path]]
"""(world, a private folder) -> (the path given, what must keep its bytes)."""


def _made(path: Path, text: str = "a,b\n1,2\n") -> Path:
    path.write_text(text)
    return path


def _link(link: Path, to: Path | str) -> Path:
    link.symlink_to(to)
    return link


_FIFOS: dict[Path, int] = {}
"""Each FIFO case's own end, open for reading and writing: a command that opened the FIFO would not
block (the case fails, it does not hang), and what it wrote would be read back."""


@pytest.fixture(autouse=True)
def _close_fifos() -> Iterator[None]:
    yield
    while _FIFOS:
        os.close(_FIFOS.popitem()[1])


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    _FIFOS[path] = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    return path


def _written_into(fifo: Path) -> bytes:
    try:
        return os.read(_FIFOS[fifo], 1 << 16)
    except BlockingIOError:
        return b""


def _outside(tmp: Path) -> Path:
    folder = tmp / "outside"
    folder.mkdir()
    _made(folder / "secret.txt", "keep")
    return folder


def _hard_link(world: World, tmp: Path) -> tuple[Path, Path]:
    os.link(world.rows, tmp / "same.csv")
    return tmp / "same.csv", world.rows


FILE_TARGETS: dict[str, Target] = {
    "its own input": lambda w, t: (w.rows, w.rows),
    "its own input by a hard link": _hard_link,
    "the run's config.toml": lambda w, t: (w.run / "config.toml", w.run / "config.toml"),
    "the run's model.safetensors": lambda w, t: (w.run / "model.safetensors", w.run / "model.safetensors"),
    "the run's metrics.jsonl": lambda w, t: (w.run / "metrics.jsonl", w.run / "metrics.jsonl"),
    "the run's scores-test.npz": lambda w, t: (w.run / "scores-test.npz", w.run / "scores-test.npz"),
    "a checkpoint's weights": lambda w, t: (w.checkpoint / "model.safetensors", w.checkpoint),
    "a new file in a checkpoint": lambda w, t: (w.checkpoint / "out.csv", w.checkpoint),
    "the training CSV": lambda w, t: (w.table, w.table),
    "another run's config.toml": lambda w, t: (w.other / "config.toml", w.other),
    "a new file in another run": lambda w, t: (w.other / "out.csv", w.other),
    "a new file under another run": lambda w, t: (w.other / "sub" / "out.csv", w.other),
    "an rl run's summary": lambda w, t: (w.rl / "summary.json", w.rl),
    "a user's file": lambda w, t: (_made(t / "notes.csv"), t / "notes.csv"),
    "a user's html": lambda w, t: (_made(t / "page.html", "<html>mine</html>"), t / "page.html"),
    "a link to a file outside": lambda w, t: (_link(t / "out.csv", _outside(t) / "secret.txt"), t / "outside"),
    "a link to /dev/stdout": lambda w, t: (_link(t / "out.csv", "/dev/stdout"), t / "out.csv"),
    "a dangling link": lambda w, t: (_link(t / "out.csv", t / "nowhere.csv"), t),
    "/dev/null": lambda w, t: (Path("/dev/null"), Path("/dev/null")),
    "a FIFO": lambda w, t: (_fifo(t / "fifo.csv"), t / "fifo.csv"),
    "a directory": lambda w, t: (t, t),
    "a file under a file": lambda w, t: (_made(t / "file") / "out.csv", t / "file"),
    "a file in /proc": lambda w, t: (Path("/proc/gputrain-out.csv"), Path("/proc/gputrain-out.csv")),
    "a name over the system's limit": lambda w, t: (t / ("x" * 300 + ".csv"), t),
    "a path over the system's limit": lambda w, t: (t / ("x/" * 3000 + "out.csv"), t),
}

FILE_COMMANDS: dict[str, Callable[[World, Path], list[str]]] = {
    "predict": lambda w, out: ["predict", str(w.run), str(w.rows), "--device", "cpu", "-o", str(out)],
    "report": lambda w, out: ["report", str(w.run), "-o", str(out)],
}


@pytest.mark.parametrize("target", FILE_TARGETS)
@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_a_file_output_never_replaces_what_is_not_its_own(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, target: str
) -> None:
    given, watched = FILE_TARGETS[target](world, tmp_path)
    _refused(capsys, FILE_COMMANDS[command](world, given), "-o", given, watched)


FOLDER_TARGETS: dict[str, Target] = {
    "another run": lambda w, t: (w.other, w.other),
    "another run's checkpoint": lambda w, t: (w.checkpoint, w.run),
    "a new folder inside another run": lambda w, t: (w.other / "mine", w.other),
    "the run's own checkpoints folder": lambda w, t: (w.run / "checkpoints", w.run),
    "an rl run": lambda w, t: (w.rl, w.rl),
    "a user's folder with their files": lambda w, t: (_user_folder(t), t / "user"),
    "a link to a folder outside": lambda w, t: (_link(t / "out", _outside(t)), t / "outside"),
    "a dangling link": lambda w, t: (_link(t / "out", t / "nowhere"), t),
    "a file": lambda w, t: (_made(t / "out"), t / "out"),
    "a FIFO": lambda w, t: (_fifo(t / "out"), t / "out"),
    "/dev/null": lambda w, t: (Path("/dev/null"), Path("/dev/null")),
    "the training data's folder": lambda w, t: (w.table.parent, w.table.parent),
    "a folder under a file": lambda w, t: (_made(t / "file") / "out", t / "file"),
    "a folder in /proc": lambda w, t: (Path("/proc/gputrain-out"), Path("/proc/gputrain-out")),
    "a name over the system's limit": lambda w, t: (t / ("x" * 300), t),
    "a path over the system's limit": lambda w, t: (t / ("x/" * 3000), t),
}


def _user_folder(tmp: Path) -> Path:
    """A folder of the user's, holding their files under names a command writes too."""
    user = tmp / "user"
    user.mkdir()
    for name in ("thesis.tex", "eval-test.json", "lr_find.json", "export.json", "model.safetensors"):
        _made(user / name, '{"mine": true}')
    return user


FOLDER_COMMANDS: dict[str, tuple[str, Callable[[World, Path], list[str]]]] = {
    "evaluate": ("--output-dir", lambda w, out: ["evaluate", str(w.run), "--device", "cpu", "--output-dir", str(out)]),
    "export": ("-o", lambda w, out: ["export", str(w.run), "--format", "safetensors", "-o", str(out)]),
    "lr-find": (
        "--run-dir",
        lambda w, out: ["lr-find", "--run-dir", str(out), "--steps", "5", "train.device=cpu", "log.progress=none"],
    ),
}


ALLOWED = {
    ("evaluate", "the training data's folder"),  # two new files beside the data, which it reads by name
    ("lr-find", "another run"),  # a training run's directory takes its curve (the last test)
}


@pytest.mark.parametrize(
    ("command", "target"), [(c, t) for c in FOLDER_COMMANDS for t in FOLDER_TARGETS if (c, t) not in ALLOWED]
)
def test_an_output_folder_is_new_empty_or_the_commands_own(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, target: str
) -> None:
    given, watched = FOLDER_TARGETS[target](world, tmp_path)
    option, args = FOLDER_COMMANDS[command]
    _refused(capsys, args(world, given), option, given, watched)


def test_export_into_the_runs_own_directory_is_refused(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["export", str(world.run), "--format", "safetensors", "-o", str(world.run)]
    _refused(capsys, args, "-o", world.run, world.run)


@pytest.mark.parametrize("how", ["by its name", "by a hard link", "by a path through a link to its folder"])
def test_predict_never_writes_over_an_input_that_reads_like_its_own_output(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    rows = _made(tmp_path / "in.csv", "input,a,b,c\n1,0.5,0.2,0.1\n2,-1,0.3,0.2\n")  # an `input` column is a feature
    given = {
        "by its name": rows,
        "by a hard link": tmp_path / "same.csv",
        "by a path through a link to its folder": tmp_path / "here" / "in.csv",
    }[how]
    if how == "by a hard link":
        os.link(rows, given)
    if how == "by a path through a link to its folder":
        _link(tmp_path / "here", tmp_path)
    args = ["predict", str(world.run), str(rows), "--device", "cpu", "-o", str(given)]
    assert "which this command reads" in _refused(capsys, args, "-o", given, rows)


# ----------------------------------------------------------------- links out of the command's own run


def _copy(world: World, tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(world.run, run)
    return run


def test_exports_default_folder_through_a_link_out_of_the_run_is_refused(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(world, tmp_path)
    _link(run / "export", _outside(tmp_path))
    args = ["export", str(run), "--format", "safetensors"]
    _refused(capsys, args, "-o (default)", run / "export", tmp_path / "outside")


@pytest.mark.parametrize("command", ["report", "evaluate"])
def test_a_default_output_that_is_a_link_is_refused(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    run = _copy(world, tmp_path)
    name, args = {
        "report": ("report.html", ["report", str(run)]),
        "evaluate": ("eval-test.json", ["evaluate", str(run), "--device", "cpu"]),
    }[command]
    _link(run / name, _outside(tmp_path) / "secret.txt")
    _refused(capsys, args, name, run / name, tmp_path / "outside")


def test_a_file_under_a_link_inside_the_run_that_leads_out_is_refused(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(world, tmp_path)
    _link(run / "preds", _outside(tmp_path))
    given = run / "preds" / "out.csv"
    args = ["predict", str(run), str(world.rows), "--device", "cpu", "-o", str(given)]
    assert "leads out of the run directory" in _refused(capsys, args, "-o", given, tmp_path / "outside")


def test_bench_infer_never_writes_its_figures_through_a_link(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(world, tmp_path)
    _link(run / "bench-infer.json", _outside(tmp_path) / "secret.txt")
    args = ["bench-infer", str(run), "--modes", "eager", "--device", "cpu", "--repeats", "1"]
    _refused(capsys, args, "RUN_DIR", run / "bench-infer.json", tmp_path / "outside")


def test_lr_find_never_writes_over_an_lr_find_json_it_did_not_write(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(world, tmp_path)
    _made(run / "lr_find.json", '{"mine": true}')
    args = ["lr-find", "--run-dir", str(run), "--steps", "5", "log.progress=none"]
    _refused(capsys, args, "--run-dir", run, run)


# ----------------------------------------------------------------- what a command owns, written again


def test_predict_writes_over_its_own_output_and_to_stdout(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "preds.csv"
    args = ["predict", str(world.run), str(world.rows), "--device", "cpu", "-o"]
    assert main([*args, str(out)]) == 0
    first = out.read_bytes()
    assert main([*args, str(out)]) == 0
    assert out.read_bytes() == first and first.startswith(b"input,predicted,p_cat")
    capsys.readouterr()
    assert main([*args, "-"]) == 0
    assert capsys.readouterr().out.encode() == first
    assert sorted(os.listdir(tmp_path)) == ["preds.csv"]  # no temporary left


def test_report_writes_over_its_own_page_and_to_stdout(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(world, tmp_path)
    for _ in range(2):
        assert main(["report", str(run)]) == 0
        assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    capsys.readouterr()
    assert main(["report", str(run), "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("<!DOCTYPE html>") and "wrote the report to standard output" in captured.err


def test_export_and_evaluate_write_again_where_they_wrote(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(world, tmp_path)
    user = tmp_path / "user"
    user.mkdir()
    _made(user / "notes.txt", "keep")
    for _ in range(2):
        assert main(["export", str(run), "--format", "safetensors"]) == 0
        assert main(["evaluate", str(run), "--device", "cpu"]) == 0
        assert main(["evaluate", str(run), "--device", "cpu", "--output-dir", str(user)]) == 0
    assert (user / "notes.txt").read_text() == "keep"
    assert sorted(os.listdir(user)) == ["eval-test.json", "notes.txt", "scores-test.npz"]
    assert main(["export", str(run), "--format", "safetensors", "--verify-only"]) == 0


def test_lr_find_writes_only_its_curve_into_a_training_run_and_again(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(world, tmp_path)
    before = _state(run)
    for _ in range(2):
        assert main(["lr-find", "--run-dir", str(run), "--steps", "30", "log.progress=none"]) == 0
    after = _state(run)
    assert set(after) - set(before) == {"lr_find.json"}
    assert {k: after[k] for k in before} == before
