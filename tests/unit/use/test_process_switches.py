"""`evaluate` and `predict` run under the run's process switches, set the one way training sets them
(gputrain/switches.py): the device made current, TF32 by precision, cuDNN autotuning off where the
run was deterministic, deterministic algorithms where it asked for them. On CPU what shows is cuDNN
autotuning, switched off, and the deterministic flag."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gputrain.use.evaluate import evaluate_run
from gputrain.use.loaded import load_run
from gputrain.use.predict import prediction_rows


@pytest.fixture
def switches_restored() -> Iterator[None]:
    saved = torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled()
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved[0]
        torch.use_deterministic_algorithms(saved[1])


def test_evaluate_sets_the_runs_switches(tiny_run, tmp_path: Path, switches_restored: None) -> None:
    run_dir = tiny_run("csv_mlp")
    torch.backends.cudnn.benchmark = True  # what another library in the process may have left
    evaluate_run(run_dir, device="cpu", out_dir=tmp_path)
    assert torch.backends.cudnn.benchmark is False  # set for a CPU run, as training's start sets it


def test_predict_sets_the_runs_switches(tiny_run, tmp_path: Path, switches_restored: None) -> None:
    run_dir = tiny_run("csv_mlp")
    loaded = load_run(run_dir, device="cpu")
    deterministic = dataclasses.replace(loaded.config.train, deterministic=True)
    loaded = dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, train=deterministic))
    raw = loaded.data.test.inputs[:4].tolist()
    (tmp_path / "rows.csv").write_text("a,b,c\n" + "".join(f"{r[0]!r},{r[1]!r},{r[2]!r}\n" for r in raw))
    torch.backends.cudnn.benchmark = True
    torch.use_deterministic_algorithms(False)
    rows = list(prediction_rows(loaded, tmp_path / "rows.csv"))
    assert len(rows) == 1 + len(raw)
    assert torch.backends.cudnn.benchmark is False and torch.are_deterministic_algorithms_enabled()
