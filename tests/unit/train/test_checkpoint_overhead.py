"""Periodic checkpoints are put off while saving would cost more than checkpoint.max_overhead of the
run's time (one process), and the best checkpoint survives the rule: held in host memory, written
with the next save, equal to the one an every-epoch run writes.

The rule's clock is a simulated one: each forward pass takes 1 ms of it and each checkpoint written
4 ms (a tiny MLP's epochs of ~1 ms and saves of ~2-5 ms), so which epochs are saved is the same on
any machine under any load."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import TensorDataset

from gputrain.checkpoint import io as checkpoint_io
from gputrain.errors import Interrupted
from gputrain.train.checkpointer import Checkpointer
from gputrain.train.trainer import Trainer
from tests.sim_clock import SimClock

FORWARD_S, SAVE_S = 0.001, 0.004


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimClock:
    sim = SimClock()
    monkeypatch.setattr("gputrain.train.build.Checkpointer", functools.partial(Checkpointer, clock=sim))
    return sim


def _trainer(run_dir: Path, overhead: float, clock: SimClock, epochs: int = 20) -> Trainer:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)
    xv, yv = torch.randn(128, 8, generator=g), torch.randint(0, 3, (128,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    model.register_forward_hook(lambda *_: clock.advance(FORWARD_S))
    config = {"train.device": "cpu", "train.epochs": epochs, "train.batch_size": 64, "log.progress": "none",
              "log.tensorboard": False, "checkpoint.keep_last": 1, "checkpoint.max_overhead": overhead,
              "train.deterministic": True}
    return Trainer(model, TensorDataset(x, y), val_data=TensorDataset(xv, yv), config=config, run_dir=run_dir)


def _count_saves(monkeypatch, clock: SimClock) -> list[int]:  # type: ignore[no-untyped-def]
    """The steps of the checkpoints written, in order; each write takes SAVE_S of `clock`."""
    steps: list[int] = []
    real = checkpoint_io.save_checkpoint

    def counting(root, step, model, state):  # type: ignore[no-untyped-def]
        steps.append(step)
        clock.advance(SAVE_S)
        return real(root, step, model, state)

    monkeypatch.setattr("gputrain.train.checkpointer.save_checkpoint", counting)
    return steps


def test_millisecond_epochs_are_not_each_saved_and_the_best_is_kept_exactly(tmp_path: Path, monkeypatch,
                                                                            clock: SimClock) -> None:
    saved = _count_saves(monkeypatch, clock)
    every = _trainer(tmp_path / "every", overhead=0.0, clock=clock)
    every_summary = every.fit()
    assert saved == list(range(4, 81, 4))  # max_overhead=0: every epoch (4 steps), as configured
    saved.clear()
    budgeted = _trainer(tmp_path / "budget", overhead=0.05, clock=clock)
    summary = budgeted.fit()
    best = budgeted.state.best_step
    assert best == every.state.best_step and summary["val"] == every_summary["val"]
    # epochs of 6 ms (4 training and 2 validation forwards): epoch 1 is saved, nothing being spent yet;
    # with 4 ms spent, the next 4 ms save waits for the run to reach 160 ms (5%), past epoch 20. So:
    # the first epoch, the best (held since its epoch), then the end
    assert 4 < best < 80 and saved == [4, best, 80]
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


def test_an_interrupt_writes_the_best_that_was_put_off(tmp_path: Path, monkeypatch, clock: SimClock) -> None:
    saved = _count_saves(monkeypatch, clock)
    trainer = _trainer(tmp_path / "run", overhead=0.05, clock=clock)
    real_end = trainer._end_epoch
    before_stop: list[tuple[int | None, list[int]]] = []

    def end_then_stop():  # type: ignore[no-untyped-def]
        status = real_end()
        if trainer.state.epoch == 12:
            before_stop.append((trainer.state.best_step, list(saved)))
            trainer.stop.requested = "SIGTERM"
        return status

    monkeypatch.setattr(trainer, "_end_epoch", end_then_stop)
    with pytest.raises(Interrupted, match="stopped by SIGTERM"):
        trainer.fit()
    [(best, saved_before)] = before_stop
    assert best is not None and best > 4 and saved_before == [4]  # the best of epoch 12 was put off, held
    assert saved == [4, best, trainer.state.global_step]  # the stop's save writes it first
    assert (tmp_path / "run" / "checkpoints" / f"step-{best}").is_dir()
