"""What the sinks write reads back as written: every figure of a row, at its step."""

from __future__ import annotations

import json
import math
from pathlib import Path

from gputrain.observe.sinks import JsonlSink, TensorBoardSink


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_reads_every_figure_of_each_row_at_its_step(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path)
    for step in range(1, 31):
        # speed figures, an int, a None, a flag and the bookkeeping keys: only numbers are scalars
        sink.write({"step": step, "epoch": 1 + step // 10, "loss": 1.0 / step, "lr": 1e-3, "grad_norm": None,
                    "samples_per_s": 1000.0 + step, "tokens": 7, "mfu": float("nan"), "stopped": False})
    sink.write({"step": 30, "epoch": 3, "split": "val", "accuracy": 0.75, "loss": 0.5})
    sink.close()
    scalars = _scalars(tmp_path)
    assert set(scalars) == {"train/loss", "train/lr", "train/samples_per_s", "train/tokens", "train/mfu",
                            "val/accuracy", "val/loss"}
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, 31))
    assert all(math.isclose(v, 1.0 / s, rel_tol=1e-6) for s, v in scalars["train/loss"])
    assert scalars["train/tokens"][0] == (1, 7.0)
    assert math.isnan(scalars["train/mfu"][0][1])
    assert scalars["val/accuracy"] == [(30, 0.75)] and scalars["val/loss"] == [(30, 0.5)]


def test_tensorboard_after_a_resume_drops_the_steps_written_again(tmp_path: Path) -> None:
    first = TensorBoardSink(tmp_path)
    for step in range(1, 21):
        first.write({"step": step, "loss": float(step)})
    first.close()
    again = TensorBoardSink(tmp_path, resume_step=10)
    for step in range(11, 16):
        again.write({"step": step, "loss": 100.0 + step})
    again.close()
    loss = _scalars(tmp_path)["train/loss"]
    assert loss == [(s, float(s)) for s in range(1, 11)] + [(s, 100.0 + s) for s in range(11, 16)]


def test_jsonl_rows_parse_with_non_finite_figures_as_null(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.write({"step": 1, "loss": float("inf"), "lr": 1e-3})
    sink.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "loss": None, "lr": 1e-3}


def test_a_broken_tensorboard_install_is_refused_before_training(cli, tmp_path: Path) -> None:
    """One built for another protobuf, say: one line naming the package and both ways out, exit 2."""
    broken = tmp_path / "site" / "tensorboard"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('tensorboard built against protobuf 3; this is protobuf 5')\n")
    from tests.conftest import ROOT

    result = cli("train", "--run-dir", "run", "train.epochs=1", cwd=tmp_path,
                 env={"PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "gputrain train: config error: log.tensorboard: the tensorboard package cannot be imported (ImportError: "
        "tensorboard built against protobuf 3; this is protobuf 5): reinstall it (pip install --force-reinstall "
        "tensorboard), or set log.tensorboard=false")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_missing_tensorboard_is_a_usage_error_of_the_api(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    import pytest
    import torch
    from torch.utils.data import TensorDataset

    from gputrain import Trainer
    from gputrain.errors import UsageError

    monkeypatch.setitem(sys.modules, "tensorboard.compat.proto.summary_pb2", None)  # as if not installed
    data = TensorDataset(torch.randn(128, 4), torch.randint(0, 2, (128,)))
    with pytest.raises(UsageError) as err:
        Trainer(torch.nn.Linear(4, 2), data, config={"train.device": "cpu", "log.progress": "none"}, run_dir=tmp_path).setup()
    assert str(err.value) == ("config error: log.tensorboard: the tensorboard package is not installed: pip install "
                              "tensorboard, or set log.tensorboard=false")


def test_rows_are_buffered_but_every_checkpointed_steps_row_is_on_disk_first(tmp_path: Path) -> None:
    """metrics.jsonl is written about once a second, not one system call per row; a checkpoint never
    holds a step whose row a kill could still lose, so a resumed run's file has every row."""
    import torch
    from torch.utils.data import TensorDataset

    from gputrain import Trainer

    data = TensorDataset(torch.randn(256, 4), torch.randint(0, 2, (256,)))
    config = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "log.every_steps": 1,
              "train.batch_size": 8, "train.epochs": 2, "checkpoint.every_steps": 5, "checkpoint.max_overhead": 0}
    trainer = Trainer(torch.nn.Linear(4, 2), data, config=config, run_dir=tmp_path)
    seen: list[tuple[int, int, int]] = []

    def on_step() -> None:  # after each step: (the step, the newest checkpoint's, the newest row on disk)
        checkpoints = [int(p.name.split("-")[1]) for p in (tmp_path / "checkpoints").glob("step-*")
                       if (p / "COMMITTED").exists()]
        rows = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        seen.append((trainer.state.global_step, max(checkpoints, default=0), max(rows, default=0)))

    trainer.fit(on_step=on_step)
    assert all(checkpoint <= row for _, checkpoint, row in seen)
    assert any(row < step for step, _, row in seen)  # between checkpoints the rows wait in the buffer
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "split" not in r] == list(range(1, 65))  # all there at the end
