"""Run directories for the report tests, each made once per session by a real run: a completed
`gputrain train` (a subprocess, as a user runs it), a failed run (a fault raised inside a forward
pass), a regression run, and the pages written from them."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path

import pytest

from gputrain.config import load_config
from gputrain.errors import RunError
from tests.conftest import run_cli
from tests.one_thread import one_thread  # noqa: F401 - an autouse fixture for this folder

# digits, a small MLP, two epochs: ~40 steps, a val split each epoch and a test split at the end
TINY = ["model.name=mlp", "model.hidden_sizes=[32]", "train.epochs=2", "train.device=cpu", "log.every_steps=2",
        "log.tensorboard=false", "log.progress=plain"]


def train_in_process(run_dir: Path, overrides: list[str]) -> None:
    """A run through the library (what `gputrain train` does, without a new interpreter)."""
    from gputrain.train.trainer import Trainer

    Trainer.from_config(load_config(None, overrides), run_dir=run_dir).fit()


@pytest.fixture(scope="session")
def completed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(run directory, what `gputrain train` printed) of a completed classification run."""
    run_dir = tmp_path_factory.mktemp("completed") / "mlp-digits"
    result = run_cli("train", "--run-dir", str(run_dir), *TINY)
    assert result.returncode == 0, result.stderr
    return run_dir, result.stdout


@pytest.fixture(scope="session")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose 7th forward pass raises: summary.json says failed, error.log holds the traceback."""
    run_dir = tmp_path_factory.mktemp("failed") / "run"
    os.environ["GPUTRAIN_TEST_FAULT"] = "rank=0,forward=7,action=raise"
    try:
        with pytest.raises(RunError, match="test fault injected at forward 7"):
            train_in_process(run_dir, [*TINY, "log.every_steps=1"])
    finally:
        del os.environ["GPUTRAIN_TEST_FAULT"]
    return run_dir


@pytest.fixture(scope="session")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("lm") / "run"
    train_in_process(run_dir, ["model.name=gpt", "model.preset=tiny", "data.name=synthetic", "data.task=lm",
                               "data.seq_len=16", "data.num_samples=256", "train.epochs=2", "train.batch_size=32",
                               "log.every_steps=2", "log.tensorboard=false", "train.device=cpu", "log.progress=none"])
    return run_dir


@pytest.fixture(scope="session")
def regression_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("regression") / "run"
    train_in_process(run_dir, ["model.name=mlp", "model.hidden_sizes=[16]", "data.name=synthetic",
                               "data.task=regression", "data.shape=[6]", "data.num_samples=600", "train.epochs=2",
                               "log.tensorboard=false", "train.device=cpu", "log.progress=none"])
    return run_dir


@pytest.fixture(scope="session")
def rl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`gputrain rl` on CartPole, 8 PPO iterations, each logged."""
    run_dir = tmp_path_factory.mktemp("rl") / "run"
    result = run_cli("rl", "--run-dir", str(run_dir), "rl.total_timesteps=4096", "log.every_steps=1",
                     "train.device=cpu", "log.progress=none", "log.tensorboard=false")
    assert result.returncode == 0, result.stderr
    return run_dir


def visible_text(page: str) -> str:
    """The page's text without tags (what a reader sees), whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
