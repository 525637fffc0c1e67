"""Which weights a `use` command loads, and the one-line refusals when there are none."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from gputrain.checkpoint.io import STATE_FILE, commit_checkpoint_dir, list_checkpoints, read_state
from gputrain.cli import main
from gputrain.errors import UsageError
from gputrain.use.loaded import load_run
from gputrain.use.run_dir import choose_weights


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
    torch.save(state, tmp / STATE_FILE)
    commit_checkpoint_dir(tmp, checkpoint, int(checkpoint.name[5:]))


def test_an_unfinished_run_falls_back_to_its_last_checkpoint_and_says_so(run_copy) -> None:
    (run_copy / "model.safetensors").unlink()
    chosen = choose_weights(run_copy)
    assert chosen.kind == "last" and chosen.note is not None and "has no final weights" in chosen.note


def test_a_damaged_checkpoint_is_skipped_for_the_one_before(run_copy) -> None:
    newest, older = list_checkpoints(run_copy / "checkpoints")[:2]
    (newest / STATE_FILE).write_bytes(b"damaged")
    assert choose_weights(run_copy, "last").path == older


def test_no_weights_names_the_checkpoints_there_are(run_copy, capsys) -> None:
    (run_copy / "model.safetensors").unlink()
    for path in list_checkpoints(run_copy / "checkpoints"):
        (path / STATE_FILE).write_bytes(b"damaged")
    assert main(["evaluate", str(run_copy)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after a warning per damaged checkpoint
    assert (
        last.startswith("gputrain evaluate: ")
        and "no weights to use: no model.safetensors, and checkpoints: step-" in last
    )
    assert last.count("(damaged)") == 2


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


def test_weights_of_another_model_are_refused_naming_the_parameter(run_copy, tiny_run) -> None:
    other = tiny_run("csv_mlp") / "model.safetensors"
    with pytest.raises(UsageError, match="the parameters differ"):
        load_run(run_copy, checkpoint=str(other), device="cpu")


def test_a_sharded_checkpoint_of_a_multi_rank_run_loads_its_model_weights(run_copy) -> None:
    """A DCP checkpoint (model and optimizer items, state.pt, manifest) as a sharded save leaves it."""
    loaded = load_run(run_copy, device="cpu")
    expected = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    tmp = run_copy / "checkpoints" / ".step-999.tmp"
    tmp.mkdir()
    optim = {"state": {}, "param_groups": [{"lr": 0.1, "params": list(expected)}]}
    dcp.save({"model": expected, "optim": optim}, checkpoint_id=str(tmp), no_dist=True)
    torch.save(read_state(choose_weights(run_copy, "last").path), tmp / STATE_FILE)
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["export", "{run}", "--format", "safetensors", "-o", "{file}"], "-o {file}: a file, not a folder"),
        (["evaluate", "{run}", "--output-dir", "{file}"], "--output-dir {file}: a file, not a folder"),
        (["predict", "{run}", "{file}", "-o", "{dir}"], "-o {dir}: a folder; give the CSV file to write"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_one_line(tiny_run, tmp_path, capsys, argv, message) -> None:
    names = {"run": str(tiny_run("csv_mlp")), "file": str(tmp_path / "taken.txt"), "dir": str(tmp_path)}
    (tmp_path / "taken.txt").write_text("a,b,c\n1,2,3\n")
    capsys.readouterr()
    assert main([arg.format(**names) for arg in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message.format(**names) in err and len(err.splitlines()) == 1, err
