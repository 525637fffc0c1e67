"""Building a Trainer is cheap (issue 29 §4): nothing distributed, no trial steps, no forward pass,
no files and no process switches until `fit()`/`setup()`; what the arguments alone tell still comes
at once; bad input found while building leaves no directory behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from gputrain import Trainer
from gputrain.errors import ConfigError, UsageError

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False}


def _data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(torch.randn(n, 5, generator=g) + 3 * F.one_hot(y, 5).float(), y)


class Counting(nn.Module):
    """Counts its forward passes: the constructor must run none (the task probe, auto's trials)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.linear(x)


def _world() -> tuple[dict[str, str], int, list[bool]]:
    flags = [torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled()]
    return dict(os.environ), torch.get_num_threads(), flags


def test_the_constructor_does_nothing_heavy(tmp_path: Path) -> None:
    model, before = Counting(), _world()
    run = tmp_path / "runs" / "one"
    trainer = Trainer(model, _data(), val_data=_data(32), config={**QUIET, "train.batch_size": "auto",
                      "train.deterministic": True, "train.num_threads": 1}, run_dir=run)
    assert model.calls == 0  # no task probe, no batch-size trial, no evaluation check
    assert not tmp_path.joinpath("runs").exists()  # nothing claimed, not even checked by writing
    assert _world() == before  # no thread count, no deterministic flag, no environment variable
    assert not torch.distributed.is_initialized()
    assert trainer.config.train.batch_size == "auto" and not trainer.built
    trainer.setup()
    assert trainer.built and model.calls > 0 and run.is_dir()
    assert isinstance(trainer.config.train.batch_size, int)  # resolved by the build
    assert trainer.setup() is trainer  # once only


def test_reading_a_built_attribute_builds_the_run(tmp_path: Path) -> None:
    trainer = Trainer(nn.Linear(5, 3), _data(), config={**QUIET, "train.batch_size": 16}, run_dir=tmp_path / "r")
    assert not trainer.built
    assert isinstance(trainer.optimizer, torch.optim.AdamW)  # the config's default optimizer
    assert trainer.built and trainer.run_dir == tmp_path / "r" and trainer.state.global_step == 0


def test_the_config_can_be_changed_until_the_run_is_built(tmp_path: Path) -> None:
    trainer = Trainer(nn.Linear(5, 3), _data(), config={**QUIET, "train.batch_size": 16}, run_dir=tmp_path)
    trainer.config = {**QUIET, "train.batch_size": 32, "train.epochs": 2}
    with pytest.raises(ConfigError, match="train.epochs"):  # checked at once, the old one kept
        trainer.config = {**QUIET, "train.epochs": 0}
    summary = trainer.fit()
    assert summary["global_step"] == 2 * (64 // 32)
    with pytest.raises(UsageError, match="already built; make a new Trainer"):
        trainer.config = {**QUIET}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "a model"}, "model: got str; give an nn.Module"),
        ({"train_data": 5}, "train_data: got int; give a Dataset"),
        ({"val_data": object()}, "val_data: got object; give a Dataset"),
        ({"test_data": 2.5}, "test_data: got float"),
        ({"loss_fn": "cross_entropy"}, "loss_fn: got str; give a function"),
        ({"step_fn": 1}, "step_fn: got int"),
        ({"eval_fn": [1]}, "eval_fn: got list"),
        ({"tp_plan": 3}, "tp_plan: got int; give {module name: ParallelStyle}"),
        ({"run_dir": " "}, "run_dir ' ': empty"),
        ({"config": {"train.epochs": -1}}, "train.epochs"),
        ({"config": {"optim.nam": "sgd"}}, "optim.nam"),
    ],
)
def test_what_the_arguments_tell_is_told_at_once(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"model": nn.Linear(5, 3), "train_data": _data(), "run_dir": tmp_path / "r", **kwargs}
    model, data = args.pop("model"), args.pop("train_data")
    with pytest.raises(UsageError) as raised:
        Trainer(model, data, **args)
    assert message in str(raised.value).splitlines()[0]
    assert not (tmp_path / "r").exists()


def test_bad_input_found_while_building_leaves_no_directory(tmp_path: Path) -> None:
    run = tmp_path / "new" / "run"
    bad_val = [(torch.zeros(7), torch.tensor(0))]  # 7 features where the model takes 5
    trainer = Trainer(nn.Linear(5, 3), _data(), val_data=bad_val, config={**QUIET, "train.batch_size": 16},
                      run_dir=run)
    with pytest.raises(UsageError, match="val_data cannot be evaluated"):
        trainer.fit()
    assert not (tmp_path / "new").exists()  # the directories the build made are gone again


def test_a_directory_that_held_something_stays(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    trainer = Trainer(nn.Linear(5, 3), _data(), val_data=[(torch.zeros(7), torch.tensor(0))],
                      config={**QUIET, "train.batch_size": 16}, run_dir=run)
    with pytest.raises(UsageError):
        trainer.setup()
    assert (run / "notes.txt").read_text() == "mine"


def test_the_constructor_joins_no_process_group_under_a_launcher(tmp_path: Path) -> None:
    # rank 0 of 2 with no rank 1 anywhere: joining would wait for it; building the Trainer must not join
    script = textwrap.dedent(f"""
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset
        from gputrain import Trainer
        data = TensorDataset(torch.randn(8, 5), torch.randint(0, 3, (8,)))
        trainer = Trainer(nn.Linear(5, 3), data, config={{"train.device": "cpu", "train.batch_size": 4}},
                          run_dir={str(tmp_path / "r")!r})
        print("joined" if torch.distributed.is_initialized() else "not joined", trainer.built)
    """)
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["not", "joined", "False"]
    assert not (tmp_path / "r").exists()
