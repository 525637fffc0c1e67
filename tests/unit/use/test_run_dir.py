"""Which weights a `use` command loads, and the one-line refusals when there are none."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from gputrain.checkpoint.io import commit_checkpoint_dir, list_checkpoints, read_state
from gputrain.cli import main
from gputrain.run.layout import CHECKPOINT_STATE
from gputrain.use.loaded import load_run
from gputrain.use.run_dir import choose_weights
from tests.conftest import run_cli


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    """A copy of the digits run (two epochs: two checkpoints, a best step) to damage."""
    target = tmp_path / "run"
    shutil.copytree(tiny_run("digits_cnn"), target)
    return target


def _equal_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_final_best_and_last_are_the_runs_files(run_copy) -> None:
    newest, older = list_checkpoints(run_copy / "checkpoints")[:2]
    _record_best_step(newest, int(older.name[5:]))  # the best is not the last, whatever training did
    final = choose_weights(run_copy, "final")
    assert final.kind == "final" and final.path == run_copy / "model.safetensors" and final.step == int(newest.name[5:])
    last = choose_weights(run_copy, "last")
    assert (last.kind, last.path) == ("last", newest)
    best = choose_weights(run_copy, "best")
    assert (best.kind, best.path, best.step) == ("best", older, int(older.name[5:]))
    # the final weights are the last checkpoint's: one training, two ways of keeping it
    final_model = load_run(run_copy, device="cpu").model
    assert _equal_weights(final_model, load_run(run_copy, checkpoint="last", device="cpu").model)
    assert not _equal_weights(final_model, load_run(run_copy, checkpoint="best", device="cpu").model)


def _record_best_step(checkpoint: Path, step: int) -> None:
    """Rewrite the checkpoint's loop state to name `step` as the best, sealed again as a save seals it."""
    tmp = checkpoint.with_name(f".{checkpoint.name}.tmp-test")
    shutil.copytree(checkpoint, tmp)
    for name in ("manifest.json", "COMMITTED"):
        (tmp / name).unlink()
    state = read_state(checkpoint)
    state["loop"]["best_step"] = step
    torch.save(state, tmp / CHECKPOINT_STATE)
    commit_checkpoint_dir(tmp, checkpoint, int(checkpoint.name[5:]))


def test_an_unfinished_run_falls_back_to_its_last_checkpoint_and_says_so(run_copy) -> None:
    (run_copy / "model.safetensors").unlink()
    chosen = choose_weights(run_copy)
    assert chosen.kind == "last" and chosen.note is not None and "has no final weights" in chosen.note


def test_a_damaged_checkpoint_is_skipped_for_the_one_before(run_copy) -> None:
    newest, older = list_checkpoints(run_copy / "checkpoints")[:2]
    (newest / CHECKPOINT_STATE).write_bytes(b"damaged")
    assert choose_weights(run_copy, "last").path == older


def test_no_weights_is_one_line_naming_each_checkpoint_and_why_it_is_unusable(run_copy) -> None:
    (run_copy / "model.safetensors").unlink()
    steps = list_checkpoints(run_copy / "checkpoints")
    for path in steps:
        (path / CHECKPOINT_STATE).write_bytes(b"damaged")
    result = run_cli("evaluate", str(run_copy))  # the real process: its warnings reach the same stderr
    assert result.returncode == 2
    names = ", ".join(path.name for path in steps)  # newest first
    assert result.stderr.splitlines() == [  # what was passed over is in the line, not warned before it
        f"gputrain evaluate: {run_copy}: no usable weights: no model.safetensors; checkpoints: {names} damaged "
        "(state.pt does not match its checksum)"
    ]


def test_a_damaged_checkpoint_passed_over_is_said_once(run_copy, gputrain_warnings) -> None:
    newest, older = list_checkpoints(run_copy / "checkpoints")[:2]
    (newest / CHECKPOINT_STATE).write_bytes(b"damaged")
    assert choose_weights(run_copy, "last").path == older
    assert gputrain_warnings == [
        f"using an older checkpoint: {newest.name} damaged (state.pt does not match its checksum)"
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p, "not a run directory (no config.toml)"),
        (lambda p: p / "missing", "no such directory"),
    ],
)
def test_a_directory_that_is_not_a_run_is_refused(tmp_path, capsys, make, message) -> None:
    assert main(["predict", str(make(tmp_path)), "x.csv"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "{run}", "--checkpoint", "{weights}"],
        ["predict", "{run}", "rows.csv", "--checkpoint", "{weights}"],
        ["export", "{run}", "--format", "safetensors", "-o", "{out}", "--checkpoint", "{weights}"],
    ],
)
@pytest.mark.parametrize("form", ["file", "checkpoint"])
def test_weights_of_another_model_are_refused_in_one_line_naming_the_parameters(
    run_copy, tiny_run, tmp_path, capsys, argv, form
) -> None:
    """Weights are loaded, not a run resumed: the message says so (training's resume says `cannot resume`)."""
    other = tiny_run("csv_mlp")
    weights = other / "model.safetensors" if form == "file" else list_checkpoints(other / "checkpoints")[0]
    names = {"run": str(run_copy), "weights": str(weights), "out": str(tmp_path / "out")}
    capsys.readouterr()
    assert main([arg.format(**names) for arg in argv]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    label = "" if form == "file" else "model.safetensors: "  # a checkpoint directory: which of its files
    assert line.startswith(
        f"gputrain {argv[0]}: cannot load weights: {weights}: {label}the parameters differ: this run's model has "
        "features.0.weight"
    ), line


def test_a_sharded_checkpoint_of_a_multi_rank_run_loads_its_model_weights(run_copy) -> None:
    """A DCP checkpoint (model and optimizer items, state.pt, manifest) as a sharded save leaves it."""
    loaded = load_run(run_copy, device="cpu")
    expected = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    tmp = run_copy / "checkpoints" / ".step-999.tmp"
    tmp.mkdir()
    optim = {"state": {}, "param_groups": [{"lr": 0.1, "params": list(expected)}]}
    dcp.save({"model": expected, "optim": optim}, checkpoint_id=str(tmp), no_dist=True)
    torch.save(read_state(choose_weights(run_copy, "last").path), tmp / CHECKPOINT_STATE)
    commit_checkpoint_dir(tmp, run_copy / "checkpoints" / "step-999", 999, fmt="dcp")
    (run_copy / "model.safetensors").unlink()
    again = load_run(run_copy, checkpoint="last", device="cpu")
    assert again.weights.step == 999
    assert all(torch.equal(again.model.state_dict()[k], v) for k, v in expected.items())


def test_the_starting_weights_a_run_loaded_are_neither_needed_nor_loaded(run_copy) -> None:
    """model.weights names what training started from: the trained weights replace it, and it may be gone."""
    config = run_copy / "config.toml"
    text = config.read_text()
    assert "# weights = (unset)" in text
    config.write_text(text.replace("# weights = (unset)", 'weights = "/nowhere/pretrained.safetensors"'))
    loaded = load_run(run_copy, device="cpu")
    assert loaded.config.model.weights == "/nowhere/pretrained.safetensors"
    assert main(["export", str(run_copy), "--format", "safetensors", "-o", str(run_copy / "st")]) == 0


USE_COMMANDS = {
    "evaluate": [],
    "predict": ["rows.csv"],
    "generate": ["--prompt", "a"],
    "export": ["--format", "safetensors"],
    "bench-infer": ["--modes", "eager"],
}
DEVICE_PROBLEMS = [("foo", "unknown device"), ("cuda:x", "the CUDA index must be a number")]
if not torch.cuda.is_available():
    DEVICE_PROBLEMS.append(("cuda", "CUDA is not available: "))


@pytest.mark.parametrize("command", list(USE_COMMANDS))
@pytest.mark.parametrize(("device", "problem"), DEVICE_PROBLEMS)
def test_every_use_command_refuses_a_device_that_is_not_here_in_one_line(
    tiny_run, capsys, command, device, problem
) -> None:
    """One check for the five commands' --device, before anything is loaded (bench-infer used to
    reach torch.cuda with it: a 30-line traceback)."""
    capsys.readouterr()
    assert main([command, str(tiny_run("csv_mlp")), *USE_COMMANDS[command], "--device", device]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"gputrain {command}: --device {device}: {problem}"), line
    assert line.endswith("; choose from auto (a GPU where there is one), cpu, cuda, cuda:N or mps"), line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "{run}", "--format", "safetensors", "-o", "{file}"], "-o {file}: is a regular file, not a folder"),
        (["evaluate", "{run}", "--output-dir", "{file}"], "--output-dir {file}: is a regular file, not a folder"),
        (["predict", "{run}", "{file}", "-o", "{dir}"], "-o {dir}: is a directory; give a file name"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_one_line(tiny_run, tmp_path, capsys, argv, message) -> None:
    names = {"run": str(tiny_run("csv_mlp")), "file": str(tmp_path / "taken.txt"), "dir": str(tmp_path)}
    (tmp_path / "taken.txt").write_text("a,b,c\n1,2,3\n")
    capsys.readouterr()
    assert main([arg.format(**names) for arg in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message.format(**names) in err and len(err.splitlines()) == 1, err


def test_resume_and_use_read_both_formats_through_the_one_reader(run_copy, tmp_path, monkeypatch) -> None:
    """`read_checkpoint` (checkpoint/reader.py) is the one reader: a `use` command's weights from a
    sharded and from a one-process checkpoint, and a resume, all pass through it (spied on its
    reading of state.pt, which every way of reading a checkpoint starts with)."""
    import gputrain.checkpoint.reader as reader
    from gputrain.train.trainer import Trainer

    one_process = choose_weights(run_copy, "last").path
    loaded = load_run(run_copy, device="cpu")
    expected = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    tmp = run_copy / "checkpoints" / ".step-999.tmp"
    tmp.mkdir()
    dcp.save(
        {"model": expected, "optim": {"state": {}, "param_groups": [{"lr": 0.1, "params": list(expected)}]}},
        checkpoint_id=str(tmp),
        no_dist=True,
    )
    torch.save(read_state(one_process), tmp / CHECKPOINT_STATE)
    sharded = commit_checkpoint_dir(tmp, run_copy / "checkpoints" / "step-999", 999, fmt="dcp")
    read: list[Path] = []
    real = reader.read_state
    monkeypatch.setattr(reader, "read_state", lambda path: (read.append(path), real(path))[1])
    load_run(run_copy, checkpoint="last", device="cpu")  # the sharded one: the newest
    load_run(run_copy, checkpoint=str(one_process), device="cpu")
    assert read == [sharded, one_process]
    # a resume of the finished run's last one-process checkpoint: read, nothing left to train
    Trainer.from_config(
        run_copy / "config.toml", run_dir=tmp_path / "resumed", overrides=[f"checkpoint.resume={one_process}"]
    ).fit()
    assert read == [sharded, one_process, one_process]
