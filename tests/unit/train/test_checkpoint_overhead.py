"""Periodic checkpoints are put off while saving would cost more than checkpoint.max_overhead of the
run's time (one process), and the best checkpoint survives the rule: held in host memory, written
with the next save, equal to the one an every-epoch run writes."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import TensorDataset

from gputrain.checkpoint import io as checkpoint_io
from gputrain.train.trainer import Trainer


def _trainer(run_dir: Path, overhead: float, epochs: int = 20) -> Trainer:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)
    xv, yv = torch.randn(128, 8, generator=g), torch.randint(0, 3, (128,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    config = {"train.device": "cpu", "train.epochs": epochs, "train.batch_size": 64, "log.progress": "none",
              "log.tensorboard": False, "checkpoint.keep_last": 1, "checkpoint.max_overhead": overhead,
              "train.deterministic": True}
    return Trainer(model, TensorDataset(x, y), val_data=TensorDataset(xv, yv), config=config, run_dir=run_dir)


def _count_saves(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    steps: list[int] = []
    real = checkpoint_io.save_checkpoint

    def counting(root, step, model, state):  # type: ignore[no-untyped-def]
        steps.append(step)
        return real(root, step, model, state)

    monkeypatch.setattr("gputrain.train.checkpointer.save_checkpoint", counting)
    return steps


def test_millisecond_epochs_are_not_each_saved_and_the_best_is_kept_exactly(tmp_path: Path, monkeypatch) -> None:
    saved = _count_saves(monkeypatch)
    every = _trainer(tmp_path / "every", overhead=0.0)
    every_summary = every.fit()
    assert len(saved) == 20  # max_overhead=0: every epoch, as configured
    saved.clear()
    budgeted = _trainer(tmp_path / "budget", overhead=0.05)
    summary = budgeted.fit()
    assert len(saved) < 20  # epochs of ~1 ms, saves of ~2-5 ms: most are put off
    best = budgeted.state.best_step
    assert best == every.state.best_step and summary["val"] == every_summary["val"]
    assert best in saved and saved[-1] == budgeted.state.global_step  # the best, then the end
    kept = sorted(p.name for p in (tmp_path / "budget" / "checkpoints").iterdir())
    assert kept == sorted({f"step-{best}", f"step-{budgeted.state.global_step}"})
    # the held best is the state of its step, not of the step it was written at
    for name in ("model.safetensors",):
        a = load_file(tmp_path / "budget" / "checkpoints" / f"step-{best}" / name)
        b = load_file(tmp_path / "every" / "checkpoints" / f"step-{best}" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state_a = torch.load(tmp_path / "budget" / "checkpoints" / f"step-{best}" / "state.pt", weights_only=False)
    state_b = torch.load(tmp_path / "every" / "checkpoints" / f"step-{best}" / "state.pt", weights_only=False)
    loop_a, loop_b = ({k: v for k, v in s["loop"].items() if k != "train_time_s"} for s in (state_a, state_b))
    assert loop_a == loop_b and loop_a["global_step"] == best
    assert torch.equal(state_a["rng"]["torch"], state_b["rng"]["torch"])
    for k, v in state_b["optimizer"]["state"].items():
        assert all(torch.equal(v[name], state_a["optimizer"]["state"][k][name]) for name in v)


def test_an_interrupt_writes_the_best_that_was_put_off(tmp_path: Path, monkeypatch) -> None:
    saved = _count_saves(monkeypatch)
    trainer = _trainer(tmp_path / "run", overhead=0.05)
    real_end = trainer._end_epoch

    def end_then_stop(ending):  # type: ignore[no-untyped-def]
        status = real_end(ending)
        if trainer.state.epoch == 12:
            trainer.stop.requested = "SIGTERM"
        return status

    monkeypatch.setattr(trainer, "_end_epoch", end_then_stop)
    trainer.parts.checkpointer._held = None
    try:
        trainer.fit()
    except Exception as err:  # noqa: BLE001 - the run ends as an interrupted one
        assert "stopped by SIGTERM" in str(err)
    best = trainer.state.best_step
    assert best is not None and best in saved
    assert (tmp_path / "run" / "checkpoints" / f"step-{best}").is_dir()
