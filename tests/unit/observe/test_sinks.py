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
