"""A run directory belongs to one run, second pass (issue 13): a complete run (completed or stopped
early) stays as it is unless asked to train longer; a run continues with its own config.toml, and a
config that differs in anything but its length and how it is logged is refused naming the keys; a
refusal writes nothing; every entry the run writes into its directory is checked for its kind and
for links leading out before anything heavy; messages say `run_dir` to Python and `--run-dir` to the
command line, and the advice they give is a command that works as written."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gputrain import Trainer
from gputrain.cli import main
from gputrain.errors import ConfigError, UsageError
from gputrain.report.overview import resume_command
from gputrain.run.files import command_line_words
from gputrain.run.signals import StoppedBySignal
from tests.adversarial.helpers import QUIET, fingerprint, linear_data, linear_trainer, read_summary
from tests.conftest import run_cli

# a stopped-early run: patience 1 on a loss that stops improving at once (lr far too high)
EARLY = {"eval.early_stop_metric": "loss", "eval.patience": 1, "optim.lr": 50.0, "train.epochs": 30,
         "data.val_fraction": 0.25, "optim.name": "sgd"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A completed run and a stopped-early one, trained once for the module."""
    root = tmp_path_factory.mktemp("kept")
    done, early = root / "done", root / "early"
    linear_trainer(done).fit()
    linear_trainer(early, **EARLY).fit()
    assert read_summary(early)["status"] == "stopped_early", read_summary(early)
    return {"done": done, "early": early}


@pytest.fixture
def done(runs: dict[str, Path], tmp_path: Path) -> Path:
    shutil.copytree(runs["done"], tmp_path / "done")
    return tmp_path / "done"


@pytest.fixture
def early(runs: dict[str, Path], tmp_path: Path) -> Path:
    shutil.copytree(runs["early"], tmp_path / "early")
    return tmp_path / "early"


# ----------------------------------------------------------------------------- a complete run stays as it is
@pytest.mark.parametrize("more", [{}, {"log.every_steps": 3}, {"checkpoint.keep_last": 1}, {"data.num_workers": 0},
                                  {"log.progress": "plain"}, {"train.epochs": 20}, {"train.max_steps": 2},
                                  {"checkpoint.every_steps": 1}, {"train.compile": True}],
                         ids=["same", "log-every", "keep-last", "workers", "progress", "fewer-epochs", "fewer-steps",
                              "ckpt-every", "compile"])
def test_a_stopped_early_run_is_kept_whatever_only_logs_or_shortens(early: Path, more: dict) -> None:
    before = fingerprint(early)
    summary = linear_trainer(early, **{**EARLY, **more}).fit()
    assert summary == read_summary(early) and summary["status"] == "stopped_early"
    assert fingerprint(early) == before


def test_a_stopped_early_run_trains_on_when_its_length_is_raised(early: Path) -> None:
    step = read_summary(early)["global_step"]
    summary = linear_trainer(early, **{**EARLY, "train.epochs": 31}).fit()
    assert summary["global_step"] > step  # it trained on (and may stop early again)


def test_a_completed_run_is_kept_with_a_smaller_batch(done: Path) -> None:
    """Before, "finished" was step >= the new total steps, which a smaller batch raises."""
    before = fingerprint(done)
    with pytest.raises(UsageError, match=r"train\.batch_size = 16 there, 8 given"):
        linear_trainer(done, **{"train.batch_size": 8}).fit()
    assert fingerprint(done) == before


DIFFERENT = [("train.batch_size", 32, "16", "32"), ("optim.lr", 0.5, "0.001", "0.5"), ("train.seed", 7, "0", "7"),
             ("optim.name", "sgd", '"adamw"', '"sgd"'), ("train.grad_accum", 2, "1", "2"),
             ("eval.patience", 9, "5", "9"), ("optim.weight_decay", 0.5, "0.0", "0.5"),
             ("train.clip_grad_norm", 0.25, "(unset)", "0.25"), ("data.val_fraction", 0.3, "0.1", "0.3"),
             ("optim.schedule", "cosine", '"constant"', '"cosine"')]


@pytest.mark.parametrize(("key", "value", "saved", "given"), DIFFERENT, ids=[d[0] for d in DIFFERENT])
def test_a_complete_run_refuses_another_config_naming_the_key(done: Path, key: str, value: Any, saved: str,
                                                               given: str) -> None:
    before = fingerprint(done)
    with pytest.raises(UsageError) as err:
        linear_trainer(done, **{key: value})
    message = str(err.value)
    assert f": {key} = {saved} there, {given} given" in message, message
    assert message.startswith(f"{done} holds a completed run (step 8) trained with another config: ")
    assert "\n" not in message and "choose another run_dir for a new run" in message
    assert f"pass config={str(done / 'config.toml')!r} to continue it with its own config" in message
    assert fingerprint(done) == before


def test_several_differences_are_counted(done: Path) -> None:
    with pytest.raises(UsageError, match=r"; optim\.lr = 0\.001 there, 0\.5 given \(and 2 more: optim\.momentum, "
                                         r"eval\.patience\)\. A run continues"):
        linear_trainer(done, **{"optim.lr": 0.5, "optim.name": "sgd", "optim.momentum": 0.5, "train.seed": 3,
                          "eval.patience": 2})


# ----------------------------------------------------------------------------- a run continues with its own config
def _interrupted(run_dir: Path, **config: Any) -> Trainer:
    """A run of 8 steps stopped by a SIGTERM after step 3 (checkpoint at step 3)."""
    holder: list[Trainer] = []

    def stop_at_3(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and holder[0].state.global_step == 2:
            holder[0].stop.requested = "SIGTERM"
        return F.cross_entropy(outputs, targets)

    torch.manual_seed(0)
    holder.append(Trainer(nn.Linear(6, 3), linear_data(), loss_fn=stop_at_3, config={**QUIET, **config},
                          run_dir=run_dir))
    with pytest.raises(StoppedBySignal) as err:
        holder[0].fit()
    assert "stopped by SIGTERM at step 3" in str(err.value)
    return holder[0]


def test_the_cli_resume_advice_works_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run with its own lr and length, interrupted: `gputrain train --run-dir D`, as the message says,
    continues it with its config, not the defaults (which would have rewritten config.toml)."""
    run_dir = tmp_path / "r"
    config_file = tmp_path / "mine.toml"
    config_file.write_text('[model]\nname = "mlp"\nhidden_sizes = [8]\n[train]\nepochs = 3\nbatch_size = 64\n'
                           'device = "cpu"\n[optim]\nlr = 0.003\n[log]\nprogress = "none"\ntensorboard = false\n'
                           "every_steps = 1\n[checkpoint]\nevery_steps = 1\nmax_overhead = 0.0\n")
    original = (tmp_path / "saved.toml")
    calls = [0]
    from gputrain.train import step as step_module

    real = step_module.train_step

    def stop_after_5(parts: Any, batches: Any, measure_grad_norm: bool) -> Any:
        calls[0] += 1
        if calls[0] == 5:
            os.kill(os.getpid(), 15)
        return real(parts, batches, measure_grad_norm)

    import gputrain.train.trainer as trainer_module

    trainer_module.train_step = stop_after_5  # type: ignore[assignment]
    try:
        assert main(["train", "--config", str(config_file), "--run-dir", str(run_dir)]) == 130
    finally:
        trainer_module.train_step = real  # type: ignore[assignment]
    shutil.copy(run_dir / "config.toml", original)
    advice = capsys.readouterr().err.strip().splitlines()[-1]
    assert advice.endswith(f"resume with: gputrain train --run-dir {shlex.quote(str(run_dir))}"), advice
    command = shlex.split(advice.split("resume with: gputrain ")[1])
    assert main(command) == 0
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["global_step"] == 3 * (1797 * 7 // 10 // 64)
    assert (run_dir / "config.toml").read_text() == original.read_text()  # the run's own config, kept


def test_overrides_apply_on_top_of_the_runs_own_config(tmp_path: Path) -> None:
    from gputrain.run.prior import load_run_config

    run_dir = tmp_path / "r"
    _interrupted(run_dir, **{"optim.lr": 0.003, "train.epochs": 4})
    config = load_run_config(run_dir, None, ["train.epochs=6"])
    assert config.optim.lr == 0.003 and config.train.epochs == 6 and config.checkpoint.resume == "auto"
    assert load_run_config(run_dir, None, []).train.epochs == 4
    assert load_run_config(tmp_path / "new", None, []).train.epochs == 20  # no run there: the defaults


def test_a_run_started_from_another_runs_checkpoint_continues_from_its_own(done: Path, tmp_path: Path) -> None:
    """config.toml keeps checkpoint.resume=<the other run's checkpoint>; continuing the branch goes on
    from the branch's own checkpoints, not back to the other run's."""
    from gputrain.run.prior import load_run_config

    branch = tmp_path / "branch"
    linear_trainer(branch, **{"train.epochs": 3, "checkpoint.resume": str(done / "checkpoints" / "step-8")}).fit()
    assert load_run_config(branch, None, []).checkpoint.resume == "auto"


@pytest.mark.parametrize("how", ["override", "config-file"])
def test_the_cli_refuses_another_config_for_a_run_naming_saved_and_given(tmp_path: Path, how: str,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    _interrupted(run_dir, **{"optim.lr": 0.003})
    before = fingerprint(run_dir)
    if how == "override":
        args = ["optim.lr=0.01"]
    else:
        other = tmp_path / "other.toml"
        other.write_text("[optim]\nlr = 0.01\n")
        args = ["--config", str(other)]
    assert main(["train", "--run-dir", str(run_dir), *args]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "optim.lr = 0.003 there, 0.01 given" in line, line
    assert "leave out --config and the overrides to continue it with its own" in line
    assert "choose another --run-dir for a new run" in line
    assert fingerprint(run_dir) == before


def test_the_runs_own_config_file_given_back_continues_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    trainer = _interrupted(run_dir, **{"optim.lr": 0.003})
    summary = Trainer(nn.Linear(6, 3), linear_data(), loss_fn=F.cross_entropy, config=str(run_dir / "config.toml"),
                      run_dir=run_dir).fit()
    assert summary["status"] == "completed" and summary["global_step"] == trainer.parts.total_steps


def test_a_damaged_config_toml_of_a_run_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    _interrupted(run_dir)
    (run_dir / "config.toml").write_text("[train\nepochs = ")
    with pytest.raises(UsageError, match=rf"^{re.escape(str(run_dir / 'config.toml'))}: the config of the run in "):
        linear_trainer(run_dir)


@pytest.mark.parametrize(("summary", "expected"), [
    ({"world_size": 1}, "gputrain train --run-dir runs/x"),
    ({"world_size": 2}, "gputrain train --nproc-per-node 2 --run-dir runs/x"),
    ({"world_size": 1, "rl": {"env": "CartPole-v1"}}, "gputrain rl --run-dir runs/x"),
])
def test_the_reports_resume_advice_is_the_command_for_the_run(summary: dict, expected: str) -> None:
    assert resume_command(summary, "runs/x") == expected


# ----------------------------------------------------------------------------- a refusal writes nothing
def _killed(run_dir: Path) -> Path:
    """A run that was killed: checkpoints, metrics, config, no summary."""
    _interrupted(run_dir, **{"checkpoint.every_steps": 1, "checkpoint.max_overhead": 0.0})
    (run_dir / "summary.json").unlink()
    return run_dir


def test_resume_never_in_a_killed_runs_directory_writes_nothing(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _killed(tmp_path / "r")
    before = fingerprint(run_dir)
    with pytest.raises(UsageError, match=r"checkpoint\.resume=never would mix two runs"):
        linear_trainer(run_dir, **{"checkpoint.resume": "never", "log.progress": "plain"}).fit()
    assert fingerprint(run_dir) == before and not (run_dir / "summary.json").exists()
    out = capsys.readouterr().out
    assert "failed" not in out and "see it: gputrain report" not in out


def test_a_shape_mismatch_at_resume_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """config.toml removed (so the config check cannot see the change): the checkpoint's check refuses,
    and the directory is left as it was, without a failed summary of a run that never began."""
    run_dir = _killed(tmp_path / "r")
    (run_dir / "config.toml").unlink()
    before = fingerprint(run_dir)
    trainer = Trainer(nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3)), linear_data(), loss_fn=F.cross_entropy,
                      config={**QUIET, "log.progress": "plain"}, run_dir=run_dir)
    with pytest.raises(UsageError, match=r"^cannot resume: "):
        trainer.fit()
    assert fingerprint(run_dir) == before
    assert "see it: gputrain report" not in capsys.readouterr().out


def test_a_checkpoint_refused_in_a_new_directory_writes_nothing(other_run: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input found while resuming (another model's checkpoint) in a new directory: no record of a
    run that never began, no table, no "see it" line."""
    run_dir = tmp_path / "branch"
    trainer = Trainer(nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 3)), linear_data(), loss_fn=F.cross_entropy,
                      config={**QUIET, "log.progress": "plain",
                              "checkpoint.resume": str(other_run / "checkpoints" / "step-4")}, run_dir=run_dir)
    with pytest.raises(UsageError, match=r"^cannot resume: "):
        trainer.fit()
    assert not run_dir.exists() or list(run_dir.iterdir()) == []
    assert "see it: gputrain report" not in capsys.readouterr().out


def test_the_cli_refusal_in_a_killed_runs_directory_is_one_line(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _killed(tmp_path / "r")
    before = fingerprint(run_dir)
    assert main(["train", "--run-dir", str(run_dir), "checkpoint.resume=never"]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert fingerprint(run_dir) == before


def test_profile_in_a_completed_runs_directory_changes_nothing(done: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = fingerprint(done)
    assert main(["profile", "--run-dir", str(done)]) == 2
    captured = capsys.readouterr()
    assert "checkpoint.resume=never would mix two runs" in captured.err and captured.out == ""
    assert fingerprint(done) == before


def test_a_failure_before_a_fresh_run_began_is_recorded(tmp_path: Path, other_run: Path) -> None:
    """Not bad input: a checkpoint whose weights cannot be read at all. A fresh directory gets the
    record; the checkpoint's own run directory is not touched."""
    run_dir = tmp_path / "fresh"
    checkpoint = other_run / "checkpoints" / "step-4"
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 10)
    before = fingerprint(other_run)
    with pytest.raises(Exception, match="cannot resume"):
        linear_trainer(run_dir, **{"checkpoint.resume": str(checkpoint)}).fit()
    assert fingerprint(other_run) == before
    assert read_summary(run_dir)["status"] == "failed" and (run_dir / "error.log").is_file()


@pytest.fixture
def other_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "other"
    linear_trainer(run_dir, **{"train.epochs": 1}).fit()
    return run_dir


# ----------------------------------------------------------------------------- the run directory's entries
def _entry(run_dir: Path, name: str, kind: str, outside: Path) -> None:
    path = run_dir / name
    if kind == "file":
        path.write_text("x")
    elif kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "link-out":
        (outside / "target").mkdir(exist_ok=True)
        (outside / "target.txt").write_text("x")
        path.symlink_to(outside / ("target" if name in ("checkpoints", "tensorboard") else "target.txt"))
    elif kind == "link-dev":
        path.symlink_to("/dev/zero")
    else:
        assert kind == "dangling"
        path.symlink_to(run_dir / "nowhere")


ENTRIES = [
    ("checkpoints", "file", r"checkpoints is a regular file, where the run keeps a directory"),
    ("checkpoints", "fifo", r"checkpoints is a FIFO \(named pipe\), where the run keeps a directory"),
    ("checkpoints", "link-out", r"checkpoints is a symbolic link leading out of the run directory \(to .*\)"),
    ("checkpoints", "dangling", r"checkpoints is a symbolic link to nothing; remove it"),
    ("tensorboard", "file", r"tensorboard is a regular file, where the run keeps a directory"),
    ("tensorboard", "link-out", r"tensorboard is a symbolic link leading out of the run directory"),
    ("summary.json", "dir", r"summary.json is a directory, where the run keeps a regular file"),
    ("summary.json", "fifo", r"summary.json is a FIFO \(named pipe\), where the run keeps a regular file"),
    ("summary.json", "link-out", r"summary.json is a symbolic link leading out of the run directory"),
    ("metrics.jsonl", "dir", r"metrics.jsonl is a directory, where the run keeps a regular file"),
    ("metrics.jsonl", "fifo", r"metrics.jsonl is a FIFO \(named pipe\), where the run keeps a regular file"),
    ("metrics.jsonl", "link-dev",
     r"metrics.jsonl is a symbolic link leading out of the run directory \(to /dev/zero\)"),
    ("metrics.jsonl", "link-out", r"metrics.jsonl is a symbolic link leading out of the run directory"),
    ("config.toml", "dir", r"config.toml is a directory, where the run keeps a regular file"),
    ("config.toml", "link-dev", r"config.toml is a symbolic link leading out of the run directory"),
    ("env.json", "dir", r"env.json is a directory, where the run keeps a regular file"),
    ("error.log", "dir", r"error.log is a directory, where the run keeps a regular file"),
    ("error.log", "fifo", r"error.log is a FIFO \(named pipe\), where the run keeps a regular file"),
    ("model.safetensors", "dir", r"model.safetensors is a directory, where the run keeps a regular file"),
    ("model.safetensors", "link-out", r"model.safetensors is a symbolic link leading out of the run directory"),
    ("scores-test.npz", "dir", r"scores-test.npz is a directory, where the run keeps a regular file"),
    ("error-rank1.log", "dir", r"error-rank1.log is a directory, where the run keeps a regular file"),
    ("trace.json", "dir", r"trace.json is a directory, where the run keeps a regular file"),
]


@pytest.mark.parametrize(("name", "kind", "pattern"), ENTRIES, ids=[f"{e[0]}-{e[1]}" for e in ENTRIES])
def test_a_wrong_entry_in_the_run_directory_is_refused_before_anything_heavy(tmp_path: Path, name: str, kind: str,
                                                                              pattern: str) -> None:
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    run_dir.mkdir()
    outside.mkdir()
    _entry(run_dir, name, kind, outside)
    with pytest.raises(UsageError) as err:
        linear_trainer(run_dir)
    assert re.fullmatch(rf"run_dir {re.escape(str(run_dir))}: {pattern}.*", str(err.value)), str(err.value)
    assert sorted(p.name for p in run_dir.iterdir()) == [name]  # nothing else written
    assert not any(outside.rglob("*events*")) and sorted(p.name for p in outside.iterdir()) in ([], ["target",
                                                                                                    "target.txt"])


@pytest.mark.parametrize("name", ["checkpoints", "metrics.jsonl"])
def test_the_cli_names_a_wrong_entry_in_one_line_before_torch_loads(tmp_path: Path, name: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / name)
    result = run_cli("train", "--run-dir", str(run_dir), cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--run-dir {run_dir}: {name} is a FIFO (named pipe)" in lines[0], result.stderr


def test_a_checkpoints_link_inside_the_run_directory_is_followed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "kept").mkdir()
    (run_dir / "checkpoints").symlink_to(run_dir / "kept")
    assert linear_trainer(run_dir).fit()["status"] == "completed"
    assert any((run_dir / "kept").glob("step-*"))


def test_a_checkpoint_reached_through_a_checkpoints_link_out_is_refused(done: Path, tmp_path: Path) -> None:
    """Verification on its own (as resume=auto meets it): a step-N whose checkpoints/ folder leads out."""
    from gputrain.checkpoint import CorruptCheckpoint, verify_checkpoint

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").symlink_to(done / "checkpoints")
    with pytest.raises(CorruptCheckpoint, match="a symbolic link leading out of the run directory"):
        verify_checkpoint(run_dir / "checkpoints" / "step-8")
    verify_checkpoint(done / "checkpoints" / "step-8")  # the same checkpoint in its own directory


def test_an_empty_run_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Path("") is the current directory: the run's files would land among the user's."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^run_dir '': empty; give the directory for the run's files$"):
        linear_trainer("")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_the_cli_refuses_an_empty_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--run-dir", ""]) == 2
    said = capsys.readouterr().err.strip()
    assert said == "gputrain train: --run-dir '': empty; give the directory for the run's files"
    assert list(tmp_path.iterdir()) == []


def test_a_name_too_long_is_one_line_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / ("x" * 300) / "run"
    assert main(["train", "--run-dir", str(run_dir)]) == 2
    assert "cannot be created or written (File name too long)" in capsys.readouterr().err


# ----------------------------------------------------------------------------- checkpoint.resume that is no checkpoint
def _resume_value(tmp_path: Path, done: Path, kind: str) -> str:
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    return {"empty-string": "", "spaces": "  ", "empty-folder": str(empty), "a-file": str(done / "summary.json"),
            "dev-null": "/dev/null", "missing": str(tmp_path / "missing")}[kind]


@pytest.mark.parametrize("kind", ["empty-string", "spaces", "empty-folder", "a-file", "dev-null", "missing"])
def test_a_resume_path_that_is_no_checkpoint_is_a_config_error(done: Path, tmp_path: Path, kind: str) -> None:
    from gputrain.config import load_config
    from gputrain.config.paths import check_resume_setting

    value = _resume_value(tmp_path, done, kind)
    with pytest.raises(ConfigError) as err:
        check_resume_setting(load_config({"checkpoint.resume": value}).checkpoint)
    message = str(err.value)
    assert message.startswith(f"config error: checkpoint.resume = {value!r}: ") and "\n" not in message
    assert "use auto, never, a checkpoint (runs/NAME/checkpoints/step-100)" in message


@pytest.mark.parametrize("where", ["run-dir", "checkpoints-folder"])
def test_a_run_directory_or_its_checkpoints_folder_means_its_latest_checkpoint(done: Path, tmp_path: Path,
                                                                              where: str) -> None:
    value = str(done if where == "run-dir" else done / "checkpoints")
    trainer = linear_trainer(tmp_path / "branch", **{"train.epochs": 3, "checkpoint.resume": value})
    assert trainer.parts.checkpointer.resume_point()[0] == done / "checkpoints" / "step-8"
    assert trainer.fit()["global_step"] == 12


def test_the_launcher_refuses_a_resume_path_that_is_no_checkpoint_once(tmp_path: Path) -> None:
    result = run_cli("train", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "r"),
                     f"checkpoint.resume={tmp_path}", cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr  # one line below: torchrun never started
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "checkpoint.resume" in lines[0] and "not a checkpoint" in lines[0], result.stderr


# ----------------------------------------------------------------------------- Python's words and the command line's
def test_python_is_told_run_dir_and_the_command_line_is_told_dash_dash_run_dir(done: Path) -> None:
    with pytest.raises(UsageError) as err:
        linear_trainer(done, **{"checkpoint.resume": "never"}).fit()
    assert "choose another run_dir" in str(err.value) and "--run-dir" not in str(err.value)
    with command_line_words(), pytest.raises(UsageError) as err:
        linear_trainer(done, **{"checkpoint.resume": "never"}).fit()
    assert "choose another --run-dir" in str(err.value)
    with pytest.raises(UsageError) as err:  # the words are the command line's only inside it
        linear_trainer(done, **{"checkpoint.resume": "never"}).fit()
    assert "choose another run_dir" in str(err.value)


def test_python_hears_run_dir_when_a_complete_run_is_kept(done: Path, capsys: pytest.CaptureFixture[str]) -> None:
    linear_trainer(done, **{"log.progress": "plain"}).fit()
    out = " ".join(capsys.readouterr().out.split())
    assert "or choose another run_dir for a new run" in out and "--run-dir" not in out


def test_an_unwritable_run_dir_names_the_option_in_python_words(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=rf"^run_dir {re.escape(str(tmp_path / 'file' / 'r'))}: cannot be created"):
        linear_trainer(tmp_path / "file" / "r")


@pytest.mark.slow
def test_the_cli_exact_rerun_of_a_stopped_early_run_changes_nothing(tmp_path: Path) -> None:
    """The probe's command: an MLP stopped early, run again as it was and with no overrides at all."""
    run_dir = tmp_path / "D"
    args = ["train", "--run-dir", str(run_dir), "model.name=mlp", "model.hidden_sizes=[8]", "train.epochs=40",
            "optim.lr=0.5", "eval.early_stop_metric=loss", "eval.patience=1", "log.tensorboard=false",
            "log.progress=plain"]
    first = run_cli(*args, cwd=tmp_path, timeout=300)
    assert first.returncode == 0 and read_summary(run_dir)["status"] == "stopped_early", first.stderr
    before = fingerprint(run_dir)
    for again in (args, ["train", "--run-dir", str(run_dir), "log.progress=plain"]):
        result = run_cli(*again, cwd=tmp_path, timeout=300)
        assert result.returncode == 0 and "complete: nothing to train" in result.stdout, result.stderr
        assert fingerprint(run_dir) == before
    result = run_cli(*args, "train.batch_size=32", cwd=tmp_path, timeout=300)
    assert result.returncode == 2 and "train.batch_size = 64 there, 32 given" in result.stderr
    assert fingerprint(run_dir) == before
