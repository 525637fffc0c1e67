"""train.batch_size=auto through the Trainer on CPU (the plan alone; trial steps need CUDA): the run's
config.toml records the batch that ran, the caller's Config is left as given, and the micro-batch is
decided once the process switches are set (the trial steps of a CUDA run land on its own GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
import torch
from torch import nn

from gputrain.config import load_config
from gputrain.data.tensors import TensorData
from gputrain.plan import batch
from gputrain.train import build
from gputrain.train.trainer import Trainer

QUIET = ["train.device=cpu", "train.max_steps=2", "log.progress=none", "log.tensorboard=false",
         "checkpoint.enabled=false", "eval.every_epochs=0"]


def _model_and_data() -> tuple[nn.Module, TensorData]:
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(512, 8, generator=g), torch.randint(0, 3, (512,), generator=g))
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), data


@pytest.mark.parametrize(("overrides", "field"), [
    (["train.batch_size=auto"], "batch_size"),
    (["train.batch_size=64", "train.micro_batch_size=auto"], "micro_batch_size"),
])
def test_auto_is_resolved_into_a_new_config_which_config_toml_records(
    overrides: list[str], field: str, tmp_path: Path
) -> None:
    given = load_config(None, [*overrides, *QUIET])
    model, data = _model_and_data()
    trainer = Trainer(model, data, config=given, run_dir=tmp_path / "run").setup()
    assert getattr(given.train, field) == "auto"  # the caller's config is not written into
    resolved = trainer.config.train
    assert isinstance(getattr(resolved, field), int) and isinstance(resolved.grad_accum, int)
    assert trainer.parts.global_batch == resolved.batch_size
    trainer.fit()
    recorded = tomllib.loads((tmp_path / "run" / "config.toml").read_text())["train"]
    assert (recorded["batch_size"], recorded["grad_accum"]) == (resolved.batch_size, resolved.grad_accum)
    assert recorded.get("micro_batch_size") == resolved.micro_batch_size


def test_the_batch_is_decided_after_the_process_switches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[str] = []

    def switches(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("switches")
        return original_switches(*args, **kwargs)

    def auto_batch(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append("auto batch")
        return batch.resolve_auto_batch(*args, **kwargs)

    original_switches = build.apply_process_switches
    monkeypatch.setattr(build, "apply_process_switches", switches)
    monkeypatch.setattr(build, "resolve_auto_batch", auto_batch)
    model, data = _model_and_data()
    Trainer(model, data, config=load_config(None, ["train.batch_size=auto", *QUIET]), run_dir=tmp_path / "run").setup()
    assert calls == ["switches", "auto batch"]


def _auto_batch_of(samples: int, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> tuple[int, str]:
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(samples, 8, generator=g), torch.randint(0, 3, (samples,), generator=g))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    trainer = Trainer(model, data, config=load_config(None, ["train.batch_size=auto", *QUIET]), run_dir=tmp_path)
    trainer.setup()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("train.batch_size=auto"))
    return int(trainer.config.train.batch_size), line


def test_auto_on_the_default_job_is_the_default_batch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The default job (digits, 1,258 training samples, which all fit in memory at once) keeps the
    default batch: auto does not turn its 20 epochs into 20 steps, so it trains the same run."""
    trainer = Trainer.from_config(None, run_dir=tmp_path / "run", overrides=["train.batch_size=auto", *QUIET])
    trainer.setup()
    assert trainer.config.train.batch_size == load_config(None, []).train.batch_size == 64
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("train.batch_size=auto"))
    assert "memory allows 1258" in line and "19 steps per epoch of 1258 samples" in line, line
    assert "the last 42 of each epoch" in line, line


@pytest.mark.parametrize(("samples", "expected"), [
    (64 * 300, 300),  # a larger split: 1/64 of it, so an epoch keeps 64 steps
    (64 * 64, 64),    # 1/64 of it is the default batch
    (1000, 64),       # a small split: the default batch, not more
    (40, 40),         # fewer samples than the default batch: one step of all of them, not none
])
def test_auto_takes_at_most_a_64th_of_the_split_or_the_default(
    samples: int, expected: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    got, line = _auto_batch_of(samples, capsys, tmp_path / "run")
    assert got == expected, line
    steps = samples // expected
    assert f"{steps} step{'s' if steps > 1 else ''} per epoch of {samples} samples" in line, line
    if samples > 64:  # memory alone would have taken more
        assert "set train.batch_size to choose it" in line, line


def test_auto_batch_cap_without_a_length_is_memory_alone() -> None:
    assert batch.auto_batch_cap(None) == batch.MAX_MICRO_BATCH
    assert batch.auto_batch_cap(64 * 1000) == 1000
