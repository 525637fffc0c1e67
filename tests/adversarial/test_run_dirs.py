"""A run directory belongs to one run: a complete run is never overwritten, two runs never mix in
one directory, and a directory that cannot be written is a usage error before anything heavy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gputrain import Trainer
from gputrain.errors import UsageError
from tests.adversarial.helpers import QUIET, fingerprint, linear_data, linear_trainer, read_summary
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def run_cli_quiet(*args: str) -> subprocess.CompletedProcess:
    from tests.conftest import run_cli

    return run_cli(*args, "log.progress=none", "log.tensorboard=false")


@pytest.fixture(scope="module")
def completed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "completed"
    linear_trainer(run_dir).fit()
    return run_dir


@pytest.fixture
def done(completed: Path, tmp_path: Path) -> Path:
    """A private copy of a completed run with checkpoints."""
    import shutil

    copy = tmp_path / "done"
    shutil.copytree(completed, copy)
    return copy


def test_rerunning_a_completed_run_changes_nothing_and_returns_its_summary(done: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    before = fingerprint(done)
    summary = linear_trainer(done, **{"log.progress": "plain"}).fit()
    assert fingerprint(done) == before
    assert summary == read_summary(done) and summary["status"] == "completed"
    out = capsys.readouterr().out
    assert "complete: nothing to train" in out and "Raise train.epochs or train.max_steps" in out


def test_rerunning_with_fewer_steps_is_still_complete(done: Path) -> None:
    before = fingerprint(done)
    linear_trainer(done, **{"train.max_steps": 3}).fit()
    assert fingerprint(done) == before


def test_a_completed_run_trains_longer_when_asked(done: Path) -> None:
    summary = linear_trainer(done, **{"train.epochs": 3}).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 12


@pytest.mark.parametrize("resume", ["never", "other"])
def test_starting_another_run_in_a_directory_with_checkpoints_is_refused(done: Path, tmp_path: Path,
                                                                         resume: str) -> None:
    other = tmp_path / "other"
    linear_trainer(other, **{"train.epochs": 1}).fit()
    path = "never" if resume == "never" else str(other / "checkpoints" / "step-4")
    before = fingerprint(done)
    with pytest.raises(UsageError) as err:
        linear_trainer(done, **{"checkpoint.resume": path}).fit()
    message = str(err.value)
    assert message.startswith(f"{done} holds a completed run (step 8): ")
    assert "choose another run_dir" in message and "\n" not in message
    assert fingerprint(done) == before


def test_resume_never_on_a_completed_run_without_checkpoints_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    linear_trainer(run_dir, **{"checkpoint.enabled": False}).fit()
    before = fingerprint(run_dir)
    with pytest.raises(UsageError, match="checkpoint.resume=never would mix two runs"):
        linear_trainer(run_dir, **{"checkpoint.resume": "never"}).fit()
    assert fingerprint(run_dir) == before


def test_a_completed_run_without_checkpoints_cannot_be_continued(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    linear_trainer(run_dir, **{"checkpoint.enabled": False}).fit()
    before = fingerprint(run_dir)
    with pytest.raises(UsageError, match="and no checkpoint to continue it from: choose another run_dir"):
        linear_trainer(run_dir, **{"checkpoint.enabled": False, "train.epochs": 3}).fit()
    assert fingerprint(run_dir) == before


def test_a_failed_attempt_without_checkpoints_starts_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    calls = [0]

    def crash(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("boom")
        return F.cross_entropy(outputs, targets)

    trainer = Trainer(nn.Linear(6, 3), linear_data(), loss_fn=crash, config={**QUIET, "checkpoint.enabled": False},
                      run_dir=run_dir)
    with pytest.raises(Exception, match="boom"):
        trainer.fit()
    assert read_summary(run_dir)["status"] == "failed"
    summary = linear_trainer(run_dir, **{"checkpoint.resume": "never", "checkpoint.enabled": False}).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 8
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "split" not in json.loads(line)]
    assert steps == list(range(1, 9))  # one run's rows only


def test_a_new_run_may_start_from_another_runs_checkpoint_in_a_new_directory(done: Path, tmp_path: Path) -> None:
    summary = linear_trainer(tmp_path / "branch", **{"train.epochs": 3,
                                               "checkpoint.resume": str(done / "checkpoints" / "step-8")}).fit()
    assert summary["global_step"] == 12


def test_an_unfinished_run_continues_from_one_of_its_own_earlier_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    trainers: list[Trainer] = []

    def stop_at_6(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and trainers[0].state.global_step == 5:
            trainers[0].stop.requested = "SIGTERM"
        return F.cross_entropy(outputs, targets)

    trainers.append(Trainer(nn.Linear(6, 3), linear_data(), loss_fn=stop_at_6,
                            config={**QUIET, "checkpoint.every_steps": 2, "checkpoint.keep_last": 5,
                                    "checkpoint.max_overhead": 0}, run_dir=run_dir))
    with pytest.raises(Exception, match="stopped by SIGTERM at step 6"):
        trainers[0].fit()
    summary = linear_trainer(run_dir, **{"checkpoint.resume": str(run_dir / "checkpoints" / "step-4")}).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 8


def test_rewinding_a_completed_run_to_an_older_checkpoint_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    saving = {"checkpoint.every_steps": 2, "checkpoint.keep_last": 5, "checkpoint.max_overhead": 0}
    linear_trainer(run_dir, **saving).fit()
    before, older = fingerprint(run_dir), str(run_dir / "checkpoints" / "step-4")
    with pytest.raises(UsageError, match="would rewrite its records"):
        linear_trainer(run_dir, **{"train.epochs": 3, "checkpoint.resume": older}).fit()
    assert fingerprint(run_dir) == before


def _unwritable(tmp_path: Path, kind: str) -> Path:
    if kind == "proc":
        return Path("/proc/gputrain-run")
    if kind == "file_parent":
        (tmp_path / "a_file").write_text("not a directory")
        return tmp_path / "a_file" / "run"
    if kind == "dev_null_parent":
        return Path("/dev/null/run")
    if kind == "sys":
        return Path("/sys/gputrain-run")
    assert kind == "name_too_long"
    return tmp_path / ("x" * 300)


UNWRITABLE = ["proc", "file_parent", "dev_null_parent", "sys", "name_too_long"]


@pytest.mark.parametrize("kind", UNWRITABLE)
def test_an_unwritable_run_dir_is_a_usage_error_before_anything_is_built(tmp_path: Path, kind: str) -> None:
    run_dir = _unwritable(tmp_path, kind)
    with pytest.raises(UsageError, match=rf"^run_dir {run_dir}: cannot be created or written \("):
        linear_trainer(run_dir)


@pytest.mark.parametrize("kind", ["proc", "file_parent"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_the_cli_answers_an_unwritable_run_dir_with_one_line_and_exit_2(tmp_path: Path, kind: str,
                                                                       ranks: int) -> None:
    run_dir = _unwritable(tmp_path, kind)
    launch = ["--nproc-per-node", "2"] if ranks == 2 else []
    result = subprocess.run([sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *launch,
                             "train.device=cpu"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--run-dir {run_dir}: cannot be created or written" in lines[0]
    assert "Traceback" not in result.stderr  # one line: no rank started to say more


@pytest.mark.parametrize("progress", ["plain", "none"])  # a quiet console still says why nothing ran
def test_the_cli_says_a_completed_run_is_complete_and_exits_0(tmp_path: Path, progress: str) -> None:
    run_dir = tmp_path / "cli"
    command = [sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), "model.name=mlp",
               "model.hidden_sizes=[16]", "train.epochs=1", f"log.progress={progress}", "log.tensorboard=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr
    before = fingerprint(run_dir)
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr
    assert "complete: nothing to train" in again.stdout and "Traceback" not in again.stderr
    assert fingerprint(run_dir) == before


# ----------------------------------------------------------------------------- one run at a time
def test_a_second_run_into_a_directory_in_use_is_refused_and_the_first_goes_on(tmp_path: Path) -> None:
    """Before, the second run resumed from the first's checkpoints and both wrote their metrics,
    checkpoints and summary over each other's, both exiting 0."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), "log.progress=none",
            "log.tensorboard=false", "train.epochs=40", "train.device=cpu"]
    first = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # training, with a checkpoint a second run would take
        wait_until(lambda: (run_dir / "checkpoints").is_dir() or first.poll() is not None, what="a checkpoint")
        assert first.poll() is None, first.communicate()
        second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first run ended before the second was refused: lengthen it"
    finally:
        _, err = first.communicate(timeout=300)
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip().splitlines()[-1] == (
        f"gputrain train: {run_dir} is in use: another run is training in it now (process {first.pid}, gputrain "
        "train); wait for it to end, or choose another --run-dir for a new run")
    assert first.returncode == 0, err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "split" not in row]
    assert steps == sorted(set(steps)) and read_summary(run_dir)["global_step"] == steps[-1]  # one run's rows


def test_the_python_api_is_refused_in_its_own_words_and_writes_nothing(tmp_path: Path) -> None:
    from gputrain.distributed.context import DistContext
    from gputrain.run.lock import run_dir_locked

    held = tmp_path / "held"
    with run_dir_locked(held, DistContext()):  # another run training there (flock: per open file, even here)
        before = fingerprint(held)
        with pytest.raises(UsageError, match=rf"is in use: another run is training in it now \(process {os.getpid()}\); "
                                             r"wait for it to end, or choose another run_dir for a new run$"):
            linear_trainer(held).fit()
        assert fingerprint(held) == before
    assert linear_trainer(held).fit()["status"] == "completed"  # free again once the other run ended



@pytest.mark.parametrize(("inside", "message"), [
    ("checkpoints/step-8", r": is a checkpoint \(it holds COMMITTED\); a run writes in a directory of its own$"),
    ("checkpoints", r": is inside the run directory {done} \(its checkpoints/\); a run writes in a directory of its "
                    r"own: choose one outside {done}/checkpoints$"),
    ("checkpoints/new", r": is inside the run directory {done} \(its checkpoints/\); .*"),
    ("tensorboard/x", r": is inside the run directory {done} \(its tensorboard/\); .*"),
], ids=["a-checkpoint", "its-checkpoints", "in-its-checkpoints", "in-its-tensorboard"])
def test_a_run_inside_another_runs_own_folders_is_refused(done: Path, inside: str, message: str) -> None:
    """Before, a run given `--run-dir A/checkpoints/step-8` wrote its final weights over that
    checkpoint's model.safetensors (and its config, metrics and summary beside them)."""
    before = fingerprint(done)
    run_dir = done / inside
    result = run_cli_quiet("train", "--run-dir", str(run_dir), "model.name=mlp", "train.epochs=1")
    assert result.returncode == 2, result.stderr
    pattern = re.escape(f"gputrain train: --run-dir {run_dir}") + message.format(done=re.escape(str(done)))
    assert re.fullmatch(pattern, result.stderr.strip()), result.stderr
    assert fingerprint(done) == before


def test_a_run_in_a_folder_of_its_own_inside_another_run_is_allowed(done: Path) -> None:
    """A fine-tuning run kept beside its base run's files writes none of them."""
    before = fingerprint(done)
    assert linear_trainer(done / "finetune").fit()["status"] == "completed"
    assert {k: v for k, v in fingerprint(done).items() if not k.startswith("finetune/")} == before


@pytest.mark.parametrize("inside", ["", "runs/first"], ids=["the-data-folder", "inside-it"])
def test_a_run_into_the_data_folder_it_reads_is_refused(tmp_path: Path, inside: str) -> None:
    """Before, the run wrote checkpoints/ and tensorboard/ into the image folder, and the next run on
    that data stopped: "photos/checkpoints: class folder holds no images"."""
    from tests.unit.data.files import write_image_folder

    photos = write_image_folder(tmp_path / "photos", classes=2, per_class=6)
    before = fingerprint(photos)
    run_dir = photos / inside if inside else photos
    result = run_cli_quiet("train", "--run-dir", str(run_dir), "data.name=image_folder", f"data.path={photos}",
                           "data.image_size=8", "model.name=cnn", "train.batch_size=4", "train.max_steps=1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"gputrain train: --run-dir {run_dir}: is inside the data folder {photos} this run reads; its files there "
        "would be read as data by the next run: choose a directory outside it")
    assert fingerprint(photos) == before and sorted(p.name for p in photos.iterdir()) == ["class_0", "class_1"]


@pytest.mark.parametrize(("files", "named", "them"), [
    ({"config.toml": '[server]\nport = 8080\n'}, "config.toml", "it"),  # a project's own config
    ({"model.safetensors": None, "config.json": '{"model_type": "gpt2"}'}, "model.safetensors", "it"),  # a model folder
    ({"summary.json": '{"total": 3}', "metrics.jsonl": '{"acc": 1}\n'}, "summary.json, metrics.jsonl", "them"),
    ({"checkpoints/epoch=3.ckpt": "lightning"}, "checkpoints/", "it"),  # another tool's checkpoints
], ids=["project-config", "model-folder", "other-summary-and-metrics", "another-tools-checkpoints"])
def test_files_no_run_wrote_are_never_written_over(tmp_path: Path, done: Path, files: dict, named: str,
                                                   them: str) -> None:
    """Before, `--run-dir .` in a project replaced its config.toml with the run's, and a model folder
    lost its model.safetensors to the run's final weights."""
    folder = tmp_path / "folder"
    folder.mkdir()
    for name, text in files.items():
        target = folder / name
        target.parent.mkdir(exist_ok=True)
        target.write_bytes((done / "model.safetensors").read_bytes()) if text is None else target.write_text(text)
    before = fingerprint(folder)
    result = run_cli_quiet("train", "--run-dir", str(folder), "model.name=mlp", "train.epochs=1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"gputrain train: --run-dir {folder}: holds {named}, which no gputrain run wrote (no run's config, summary "
        f"or checkpoint beside {them}); a run would write over {them}: choose an empty or new directory")
    assert fingerprint(folder) == before


def test_an_attempt_that_left_only_its_config_is_started_over(tmp_path: Path) -> None:
    """A run killed before its first checkpoint left config.toml (a run's): the directory is that run's."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    from gputrain.config import config_to_toml, load_config

    (run_dir / "config.toml").write_text(config_to_toml(load_config({**QUIET})))
    assert linear_trainer(run_dir).fit()["status"] == "completed"
