"""`gputrain rl` under `train`'s run-directory rules (issue 34, mechanism 4): one run at a time in a
directory (two `rl`, or `rl` and `train`, never mix their files), one run per directory (a finished
or different run's directory is refused, the same run continues), the kind of run recorded so that a
`train` directory is never continued by `rl` nor the reverse (old directories, which did not record
it, told by what they hold), fields `rl` does not read refused when set, and its sizes bounded
before any work starts. Every refusal: exit 2, one line naming the directory or field, nothing
written."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from gputrain.cli import main
from gputrain.errors import ConfigError, Interrupted
from gputrain.rl.trainer import PPOTrainer
from tests.adversarial.helpers import fingerprint, read_summary
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["log.progress=none", "log.tensorboard=false", "train.device=cpu"]
RL = ["rl.num_envs=2", "rl.num_steps=4", "rl.num_minibatches=1", "rl.update_epochs=1", "rl.total_timesteps=24",
      "rl.hidden_sizes=[4]", "log.every_steps=1", "checkpoint.every_steps=1", *QUIET]
TRAIN = ["model.name=mlp", "model.hidden_sizes=[8]", "data.name=synthetic", "data.shape=[4]", "data.num_samples=128",
         "train.batch_size=32", "train.epochs=1", "eval.every_epochs=0", "log.every_steps=1", *QUIET]


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _refused(*args: str) -> str:
    """The one line `gputrain ARGS` is refused with (exit 2, no traceback)."""
    code, _, err = _cli(*args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]


def _forget_kind(run_dir: Path) -> None:
    """Make `run_dir` as a run written before the kind was recorded left it."""
    env = json.loads((run_dir / "env.json").read_text())
    del env["run"]["kind"]
    (run_dir / "env.json").write_text(json.dumps(env))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A completed run of each kind."""
    root = tmp_path_factory.mktemp("runs")
    made = {"train": root / "train", "rl": root / "rl"}
    assert _cli("train", "--run-dir", str(made["train"]), *TRAIN)[0] == 0
    assert _cli("rl", "--run-dir", str(made["rl"]), *RL)[0] == 0
    return made


def _copy(runs: dict[str, Path], kind: str, tmp_path: Path, state: str) -> Path:
    """A private copy of the completed `kind` run, as `state` leaves it: complete; killed (its
    checkpoints, no summary); old (no kind recorded); old and killed."""
    run_dir = tmp_path / f"{kind}-{state}"
    shutil.copytree(runs[kind], run_dir)
    if "killed" in state:
        (run_dir / "summary.json").unlink()
        (run_dir / "model.safetensors").unlink()
    if "old" in state:
        _forget_kind(run_dir)
    return run_dir


# ----------------------------------------------------------------------------- one kind of run per directory
CROSSING = [
    # (directory's kind, its state, the command, its overrides)
    ("train", "complete", "rl", []),  # continuing it with its own config.toml
    ("train", "complete", "rl", RL),
    ("train", "complete", "rl", [*RL, "checkpoint.resume=never"]),
    ("train", "killed", "rl", []),
    ("train", "old", "rl", []),
    ("train", "old-killed", "rl", RL),
    ("rl", "complete", "train", []),
    ("rl", "complete", "train", TRAIN),
    ("rl", "complete", "train", [*TRAIN, "train.epochs=5"]),  # "training longer" is no way in either
    ("rl", "killed", "train", []),
    ("rl", "old", "train", TRAIN),
    ("rl", "old-killed", "train", []),
    ("rl", "complete", "profile", []),  # profile trains a Trainer: the train kind
]


@pytest.mark.parametrize(("kind", "state", "command", "overrides"), CROSSING,
                         ids=[f"{c}-into-{s}-{k}{'-' + str(len(o)) if o else ''}" for k, s, c, o in CROSSING])
def test_a_directory_of_the_other_kind_is_refused_naming_both(runs: dict[str, Path], tmp_path: Path, kind: str,
                                                               state: str, command: str, overrides: list[str]) -> None:
    run_dir = _copy(runs, kind, tmp_path, state)
    before = fingerprint(run_dir)
    line = _refused(command, "--run-dir", str(run_dir), *overrides)
    what = "a run that left no summary but checkpoints" if "killed" in state else "a completed run"
    assert line.startswith(f"gputrain {command}: {run_dir} holds {what}"), line
    maker = "train" if kind == "train" else "rl"
    assert line.endswith(f"made by gputrain {maker}; gputrain {'train' if command == 'profile' else command} does not "
                         "continue another command's run (a run directory holds one run): choose another --run-dir "
                         "for a new run"), line
    assert fingerprint(run_dir) == before


def test_the_other_kinds_config_is_not_read_first(runs: dict[str, Path], tmp_path: Path) -> None:
    """A train run whose data file is gone since: rl is told whose directory it is, not about the data."""
    run_dir = _copy(runs, "train", tmp_path, "complete")
    config = run_dir / "config.toml"
    text = config.read_text().replace('name = "synthetic"', 'name = "csv"', 1)
    config.write_text(text.replace("# path = (unset)", f'path = "{tmp_path / "gone.csv"}"', 1))
    line = _refused("rl", "--run-dir", str(run_dir))
    assert line.startswith(f"gputrain rl: {run_dir} holds a completed run (step "), line
    assert "made by gputrain train;" in line, line


def test_the_python_api_is_refused_in_its_words(runs: dict[str, Path], tmp_path: Path) -> None:
    from gputrain.errors import UsageError

    run_dir = _copy(runs, "train", tmp_path, "complete")
    before = fingerprint(run_dir)
    with pytest.raises(UsageError, match=r"made by gputrain train; gputrain rl does not continue .* choose another "
                                         r"run_dir for a new run$"):
        PPOTrainer(None, run_dir=run_dir, overrides=RL)
    assert fingerprint(run_dir) == before


def test_a_run_of_the_other_kind_that_began_after_the_claim_is_refused_once_held(runs: dict[str, Path],
                                                                                  tmp_path: Path) -> None:
    """The build claims an empty directory; a `train` run writes there before the loop takes the
    lock: the loop, holding the directory, looks again and leaves that run's files as they are."""
    from gputrain.errors import UsageError

    run_dir = tmp_path / "run"
    trainer = PPOTrainer(None, run_dir=run_dir, overrides=RL)
    shutil.copytree(runs["train"], run_dir, dirs_exist_ok=True)
    before = fingerprint(run_dir)
    with pytest.raises(UsageError, match=r"made by gputrain train; gputrain rl does not continue"):
        trainer.fit()
    assert fingerprint(run_dir) == before


# ----------------------------------------------------------------------------- one run per directory
SAME_KIND = [
    ("another config", ["rl.hidden_sizes=[8]"], "trained with another config: rl.hidden_sizes = [4] there, [8] given"),
    ("another env", ["rl.env=Acrobot-v1"], "trained with another config: rl.env = \"CartPole-v1\" there"),
    ("resume never", ["checkpoint.resume=never"], "checkpoint.resume=never would mix two runs in one directory"),
]


@pytest.mark.parametrize(("change", "line"), [(c, e) for _, c, e in SAME_KIND], ids=[n for n, _, _ in SAME_KIND])
def test_a_finished_rl_run_with_a_different_config_is_refused(runs: dict[str, Path], tmp_path: Path,
                                                               change: list[str], line: str) -> None:
    run_dir = _copy(runs, "rl", tmp_path, "complete")
    before = fingerprint(run_dir)
    assert line in _refused("rl", "--run-dir", str(run_dir), *RL, *change)
    assert fingerprint(run_dir) == before


@pytest.mark.parametrize("state", ["complete", "old"])
def test_a_finished_rl_run_is_kept_and_continues_when_asked_longer(runs: dict[str, Path], tmp_path: Path,
                                                                    state: str) -> None:
    run_dir = _copy(runs, "rl", tmp_path, state)
    before = fingerprint(run_dir)
    code, out, err = _cli("rl", "--run-dir", str(run_dir), "log.progress=plain")
    assert code == 0 and "complete: nothing to train" in out, err
    assert fingerprint(run_dir) == before
    code, _, err = _cli("rl", "--run-dir", str(run_dir), "rl.total_timesteps=32")
    assert code == 0, err
    assert read_summary(run_dir)["global_step"] == 4
    assert json.loads((run_dir / "env.json").read_text())["run"]["kind"] == "rl"  # recorded from now on


def test_an_interrupted_rl_run_resumes_in_its_directory(tmp_path: Path, handlers: None) -> None:
    run_dir = tmp_path / "run"

    def stop_at_2(iteration: int) -> None:
        if iteration == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted):
        PPOTrainer(None, run_dir=run_dir, overrides=RL).fit(on_iteration=stop_at_2)
    code, _, err = _cli("rl", "--run-dir", str(run_dir))
    assert code == 0, err
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3] and read_summary(run_dir)["status"] == "completed"


# ----------------------------------------------------------------------------- one run at a time
def _start(command: str, run_dir: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "gputrain", command, "--run-dir", str(run_dir), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


LONG = {"rl": [*RL, "rl.total_timesteps=100000000"],
        "train": [*TRAIN, "train.epochs=1000000", "checkpoint.every_steps=1", "checkpoint.max_overhead=0"]}
CONCURRENT = [("rl", "rl"), ("rl", "train"), ("train", "rl")]


@pytest.mark.parametrize(("first", "second"), CONCURRENT, ids=[f"{b}-while-{a}-runs" for a, b in CONCURRENT])
def test_a_second_run_while_one_trains_is_refused_and_the_first_goes_on(tmp_path: Path, first: str,
                                                                        second: str) -> None:
    """Before, two `gputrain rl` into one directory both exited 0 with their files mixed."""
    run_dir = tmp_path / "run"
    running = _start(first, run_dir, *LONG[first])
    try:
        # training, with a checkpoint a second run would take: it holds the directory
        wait_until(lambda: (run_dir / "checkpoints").is_dir() or running.poll() is not None, what="a checkpoint")
        assert running.poll() is None, running.communicate()
        other = _start(second, run_dir, *LONG[second])
        _, err = other.communicate(timeout=300)
        assert running.poll() is None, "the first run ended before the second was refused"
    finally:
        running.send_signal(signal.SIGTERM)
        _, first_err = running.communicate(timeout=300)
    assert other.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gputrain {second}: {run_dir} "), err
    if first == second:
        assert lines[0] == (f"gputrain {second}: {run_dir} is in use: another run is training in it now (process "
                            f"{running.pid}, gputrain {first}); wait for it to end, or choose another --run-dir for a "
                            "new run")
    else:
        assert f"made by gputrain {first}; gputrain {second} does not continue another command's run" in lines[0]
    assert running.returncode == 130, first_err  # stopped by the signal, its checkpoint saved
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "split" not in row]
    assert steps == list(range(1, len(steps) + 1)) and read_summary(run_dir)["global_step"] == steps[-1]  # one run's
    assert json.loads((run_dir / "env.json").read_text())["run"]["kind"] == first


# ----------------------------------------------------------------------------- fields rl does not read
UNUSED = ["model.name=gpt", "model.hidden_sizes=[8]", "model.dropout=0.1", "data.name=mnist", "data.path=/tmp",
          "data.num_samples=64", "train.epochs=3", "train.max_steps=10", "train.batch_size=128", "train.grad_accum=2",
          "train.cuda_graphs=true", "train.fp8_recipe=rowwise", "optim.name=sgd", "optim.weight_decay=0.1",
          "optim.schedule=cosine", "optim.warmup_steps=10", "optim.betas=[0.8, 0.9]", "eval.every_epochs=0",
          "eval.early_stop_metric=loss", "checkpoint.every_epochs=2", "checkpoint.max_overhead=0",
          "log.breakdown_every=5", "parallel.tp=2", "parallel.activation_checkpointing=full"]


@pytest.mark.parametrize("override", UNUSED)
def test_a_field_rl_does_not_read_is_refused_when_set(tmp_path: Path, override: str) -> None:
    """Before, `gputrain rl model.name=gpt` (or optim.name=sgd) completed as if it was not there."""
    key = override.split("=")[0]
    run_dir = tmp_path / "run"
    line = _refused("rl", "--run-dir", str(run_dir), *RL, override)
    assert line.startswith(f"gputrain rl: config error: {key} = "), line
    assert ": gputrain rl does not use this field" in line and line.endswith("; leave it unset"), line
    assert not run_dir.exists()


def test_a_config_file_of_train_is_refused_for_rl(tmp_path: Path) -> None:
    (tmp_path / "train.toml").write_text('[model]\nname = "mlp"\n[train]\nepochs = 3\n')
    line = _refused("rl", "--config", str(tmp_path / "train.toml"), "--run-dir", str(tmp_path / "run"), *RL)
    assert "model.name = 'mlp': gputrain rl does not use this field" in line


def test_the_python_api_refuses_an_unused_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config error: optim.name = 'sgd': gputrain rl does not use this field"):
        PPOTrainer(None, run_dir=tmp_path / "run", overrides=[*RL, "optim.name=sgd"])
    assert not (tmp_path / "run" / "config.toml").exists()


# ----------------------------------------------------------------------------- bounds, before any work
BOUNDS = [
    (["rl.hidden_sizes=[]"], "rl.hidden_sizes = []: needs at least one hidden layer"),
    (["rl.hidden_sizes=[0]"], "rl.hidden_sizes = [0]: must be > 0"),
    (["rl.hidden_sizes=[70000]"], "rl.hidden_sizes = [70000]: must be at most 65536"),
    (["rl.num_envs=16000000"], "rl.num_envs = 16000000: must be at most 1048576 (environments stepped together"),
    (["rl.num_envs=1048577"], "rl.num_envs = 1048577: must be at most 1048576"),
    (["rl.num_envs=0"], "rl.num_envs = 0: must be > 0"),
    (["rl.num_steps=1048577"], "rl.num_steps = 1048577: must be at most 1048576"),
    (["rl.total_timesteps=1099511627777"], "rl.total_timesteps = 1099511627777: must be at most 1099511627776"),
    (["rl.update_epochs=10001"], "rl.update_epochs = 10001: must be at most 10000"),
    (["rl.num_minibatches=16777217"], "rl.num_minibatches = 16777217: must be at most 16777216"),
    (["rl.num_envs=1048576", "rl.num_steps=1048576", "rl.total_timesteps=1099511627776"],
     "rl.num_envs = 1048576: with rl.num_steps = 1048576, a rollout holds 1,099,511,627,776 transitions: "),
]


@pytest.mark.parametrize(("overrides", "words"), BOUNDS, ids=[" ".join(o) for o, _ in BOUNDS])
def test_sizes_are_bounded_before_any_work_with_the_limit_named(tmp_path: Path, overrides: list[str],
                                                                words: str) -> None:
    run_dir = tmp_path / "run"
    line = _refused("rl", "--run-dir", str(run_dir), *RL, *overrides)
    assert line.startswith("gputrain rl: config error: ") and words in line, line
    assert not any(run_dir.glob("*"))  # nothing written
