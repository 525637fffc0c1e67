"""Issue 29 part 3: the loop's cadences and limits. Validation on a step cadence (rows at N, 2N, ...
and at the end; a kill around a mid-epoch validation resumes bit for bit, rows and weights), a time
budget on a simulated clock (stops cleanly with a checkpoint, status timed_out, counted over every
invocation, continues when raised), steps per epoch and evaluation batches limited, a smoke run that
keeps nothing, and Trainer.validate()/test() on the current weights or a checkpoint's."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader

from gputrain import Trainer
from gputrain.errors import Interrupted, RunError
from gputrain.train.cadence import ELAPSED, TimeBudget
from tests.adversarial.helpers import QUIET, linear_data, read_summary
from tests.sim_clock import SimClock
from tests.unit.train.helpers import make_trainer

TIMING = {
    "lr",
    "grad_norm",
    "samples_per_s",
    "tokens_per_s",
    "step_time_s",
    "mfu",
    "achieved_flops",
    "time_breakdown",
    "data_s",
    "h2d_s",
}


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def val_steps(run_dir: Path) -> list[int]:
    return [row["step"] for row in rows(run_dir) if row.get("split") == "val"]


def comparable(run_dir: Path) -> list[dict]:
    """Every row without its timing figures (which differ between any two runs)."""
    timing = [k for row in rows(run_dir) for k in row if k.endswith(("_s", "_bytes")) or k.startswith("time_")]
    return [{k: v for k, v in row.items() if k not in TIMING and k not in timing} for row in rows(run_dir)]


def linear(run_dir: Path, n: int = 256, **config) -> Trainer:
    """16 steps per epoch at QUIET's batch 16; a validation and a test split."""
    torch.manual_seed(0)
    return Trainer(
        nn.Linear(6, 3),
        linear_data(n),
        val_data=linear_data(32),
        test_data=linear_data(48),
        loss_fn=F.cross_entropy,
        config={**QUIET, **config},
        run_dir=run_dir,
    )


# --- eval.every_steps -------------------------------------------------------------------------------


def test_every_steps_50_logs_validation_rows_at_50_100_and_the_end(tmp_path: Path) -> None:
    run = tmp_path / "r"
    summary = linear(run, **{"train.epochs": 10, "eval.every_steps": 50, "eval.every_epochs": 0}).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 160
    assert val_steps(run) == [50, 100, 150, 160]
    last = next(r for r in rows(run)[::-1] if r.get("split") == "val")
    assert summary["val"] == {k: v for k, v in last.items() if k not in ("step", "epoch", "split")}


def test_every_steps_and_every_epochs_together_never_validate_twice_at_one_step(tmp_path: Path) -> None:
    run = tmp_path / "r"
    linear(run, **{"train.epochs": 4, "eval.every_steps": 8, "eval.every_epochs": 1}).fit()
    # epochs end at 16, 32, 48, 64: the step cadence's 16, 32, ... coincide and come once
    assert val_steps(run) == [8, 16, 24, 32, 40, 48, 56, 64]


def test_a_step_cadence_new_best_is_checkpointed_at_once(tmp_path: Path) -> None:
    run = tmp_path / "r"
    # mode=max on the loss: the first validation (step 5, highest loss) is the best; nothing else
    # saves before the end, and keep_last=1 keeps only the end's beside the best
    trainer = linear(
        run,
        **{
            "train.epochs": 2,
            "eval.every_steps": 5,
            "eval.every_epochs": 0,
            "eval.mode": "max",
            "checkpoint.every_epochs": 0,
            "checkpoint.max_overhead": 0.0,
            "checkpoint.keep_last": 1,
        },
    )
    summary = trainer.fit()
    assert summary["best"]["step"] == 5
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-32", "step-5"]


def test_early_stopping_on_the_step_cadence_stops_mid_epoch_with_a_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "r"
    # the LR 0 makes no progress: patience 2 runs out at the third validation, step 12 of epoch 1
    summary = linear(
        run,
        **{
            "train.epochs": 5,
            "eval.every_steps": 4,
            "eval.every_epochs": 0,
            "optim.lr": 1e-12,
            "eval.early_stop_metric": "loss",
            "eval.patience": 2,
            "eval.mode": "min",
        },
    ).fit()
    assert summary["status"] == "stopped_early" and summary["global_step"] in (8, 12)
    assert (run / "checkpoints" / f"step-{summary['global_step']}" / "COMMITTED").is_file()
    assert [r["split"] for r in rows(run) if "split" in r][-1] == "test"


# mode=max on the loss makes the first validation the best and every later one a miss, so patience 3
# runs out at step 28: a resume that lost what a validation taught early stopping stops elsewhere
DIGITS = {
    "train.epochs": 2,
    "train.batch_size": 64,
    "train.deterministic": True,
    "eval.every_steps": 7,
    "eval.every_epochs": 0,
    "checkpoint.every_steps": 7,
    "eval.early_stop_metric": "loss",
    "eval.mode": "max",
    "eval.patience": 3,
}


def _assert_same_run(a: Path, b: Path) -> None:
    assert comparable(a) == comparable(b)  # every step's loss and every validation, bit for bit
    assert read_summary(a)["best"] == read_summary(b)["best"]
    assert read_summary(a)["global_step"] == read_summary(b)["global_step"]
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_signal_after_a_mid_epoch_validation_resumes_bit_exact(tmp_path: Path) -> None:
    unbroken = tmp_path / "unbroken"
    summary = make_trainer(unbroken, **DIGITS).fit()
    assert summary["status"] == "stopped_early" and val_steps(unbroken) == [7, 14, 21, 28]
    run, calls, trainers = tmp_path / "stopped", {"n": 0}, []

    def stop_at_15(outputs, targets):  # the step after the validation of step 14, mid-epoch
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 15:
                trainers[0].stop.requested = "SIGTERM"
        return F.cross_entropy(outputs, targets)

    trainers.append(make_trainer(run, loss_fn=stop_at_15, **DIGITS))
    with pytest.raises(Interrupted, match="at step 15"):
        trainers[0].fit()
    make_trainer(run, **DIGITS).fit()
    _assert_same_run(unbroken, run)


def test_a_crash_resumes_from_the_checkpoint_of_a_validation_step_bit_exact(tmp_path: Path) -> None:
    unbroken = tmp_path / "unbroken"
    make_trainer(unbroken, **DIGITS).fit()
    run, calls = tmp_path / "crashed", {"n": 0}

    def crash_at_16(outputs, targets):
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 16:
                raise RuntimeError("simulated crash")
        return F.cross_entropy(outputs, targets)

    with pytest.raises(RunError, match="simulated crash"):
        make_trainer(run, loss_fn=crash_at_16, **DIGITS).fit()
    make_trainer(run, **DIGITS).fit()  # from step 14: its validation (best metric) is in the checkpoint
    _assert_same_run(unbroken, run)


# --- train.max_time: a simulated clock, each training forward takes 1 s of it -------------------------


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimClock:
    sim = SimClock()
    monkeypatch.setattr("gputrain.train.build.TimeBudget", functools.partial(TimeBudget, clock=sim))
    return sim


def timed(run_dir: Path, clock: SimClock, **config) -> Trainer:
    trainer = linear(run_dir, **{"train.epochs": 3, **config})
    trainer.model.register_forward_hook(lambda *_: clock.advance(1.0) if torch.is_grad_enabled() else None)
    return trainer


def test_max_time_stops_cleanly_and_a_raised_limit_continues_to_the_unbroken_end(
    tmp_path: Path, clock: SimClock
) -> None:
    unbroken = tmp_path / "unbroken"
    timed(unbroken, clock).fit()
    run = tmp_path / "run"
    summary = timed(run, clock, **{"train.max_time": "10s"}).fit()
    assert summary["status"] == "timed_out" and summary["global_step"] == 10
    assert "train.max_time (10.0 s) spent" in summary["stop_reason"] and "step 10" in summary["stop_reason"]
    assert (run / "checkpoints" / "step-10" / "COMMITTED").is_file()
    assert summary["test"] == {} and read_summary(run)["status"] == "timed_out"
    # the budget counts every invocation: 10 s spent, 25 s allowed, 15 steps more
    summary = timed(run, clock, **{"train.max_time": 25}).fit()
    assert summary["status"] == "timed_out" and summary["global_step"] == 25
    # a continuation whose limit is spent already takes one step, as Lightning's does
    assert timed(run, clock, **{"train.max_time": 25}).fit()["global_step"] == 26
    summary = timed(run, clock).fit()  # no limit: to the end
    assert summary["status"] == "completed" and summary["global_step"] == 48
    _assert_same_run(unbroken, run)


def test_a_limit_first_set_on_a_continuation_counts_from_there(tmp_path: Path, clock: SimClock) -> None:
    run, trainers = tmp_path / "run", []

    def stop_at_5(*_: object) -> None:
        if torch.is_grad_enabled() and clock() == 5.0:
            trainers[0].stop.requested = "SIGTERM"

    trainers.append(timed(run, clock))
    trainers[0].model.register_forward_hook(stop_at_5)
    with pytest.raises(Interrupted, match="at step 5"):
        trainers[0].fit()
    state = torch.load(run / "checkpoints" / "step-5" / "state.pt", weights_only=True)
    assert ELAPSED not in state["loop"]["extra"]  # no limit, no time recorded: checkpoints as they were
    summary = timed(run, clock, **{"train.max_time": 8}).fit()
    assert summary["status"] == "timed_out" and summary["global_step"] == 13


def test_a_checkpoint_counts_the_evaluation_before_it(tmp_path: Path, clock: SimClock) -> None:
    run = tmp_path / "run"
    trainer = linear(run, **{"train.epochs": 2, "train.max_time": 10**6, "checkpoint.max_overhead": 0.0})
    before_step: list[float] = []  # the clock as each training step's forward begins

    def tick(*_: object) -> None:
        if torch.is_grad_enabled():
            before_step.append(clock())
        clock.advance(1.0)  # every forward, the validation's too

    trainer.model.register_forward_pre_hook(tick)
    trainer.fit()
    state = torch.load(run / "checkpoints" / "step-16" / "state.pt", weights_only=True)
    # epoch 1's checkpoint comes after its validation: it holds all the time up to step 17
    assert state["loop"]["extra"][ELAPSED] == before_step[16] > 16


# --- train.limit_batches, eval.max_batches --------------------------------------------------------


def test_limit_batches_ends_each_epoch_after_that_many_steps(tmp_path: Path) -> None:
    run = tmp_path / "r"
    summary = linear(run, **{"train.epochs": 3, "train.limit_batches": 5}).fit()
    assert summary["global_step"] == 15 and summary["epochs_completed"] == 3
    assert val_steps(run) == [5, 10, 15]
    steps = [r["step"] for r in rows(run) if "split" not in r]
    assert steps == list(range(1, 16))


def test_max_batches_evaluates_the_first_batches_of_a_dataloader(tmp_path: Path) -> None:
    val = linear_data(32)
    loader = DataLoader(val, batch_size=4)
    first = DataLoader(torch.utils.data.Subset(val, range(8)), batch_size=4)
    a = linear(tmp_path / "a", **{"eval.max_batches": 2})
    b = linear(tmp_path / "b")
    a.val_data, b.val_data = loader, first
    assert a.validate() == b.validate()
    assert a.validate() != linear(tmp_path / "c").validate()  # the whole split differs


# --- train.smoke_steps ------------------------------------------------------------------------------


def test_a_smoke_run_trains_evaluates_saves_reads_back_and_keeps_nothing(tmp_path: Path, capsys) -> None:
    given = tmp_path / "given"
    trainer = linear(given, **{"train.smoke_steps": 3, "train.epochs": 5, "log.progress": "plain"})
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["global_step"] == 3
    assert summary["val"] and summary["test"]
    assert not trainer.run_dir.exists() and not given.exists()
    out = capsys.readouterr().out
    assert "smoke run passed: 3 training steps" in " ".join(out.split())
    # the final table points at no directory: the one the run wrote in is gone
    assert "see it: gputrain report" not in out and "run directory:" not in out


def test_a_smoke_run_whose_checkpoint_does_not_read_back_fails(tmp_path: Path, monkeypatch) -> None:
    import gputrain.train.smoke as smoke

    real = smoke.restore_training_state

    def corrupt(*args, **kwargs):  # the read-back puts other weights in: the check must see it
        state = real(*args, **kwargs)
        with torch.no_grad():
            next(trainer.model.parameters()).add_(1.0)
        return state

    monkeypatch.setattr(smoke, "restore_training_state", corrupt)
    trainer = linear(tmp_path / "r", **{"train.smoke_steps": 2})
    with pytest.raises(RunError, match="read back does not hold the run's state: weights differ"):
        trainer.fit()


# --- Trainer.validate() / Trainer.test() ----------------------------------------------------------


def test_validate_and_test_on_current_weights_and_on_a_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "r"
    trainer = linear(run, **{"train.epochs": 2})
    summary = trainer.fit()
    assert trainer.validate() == summary["val"] and trainer.test() == summary["test"]
    before = (run / "metrics.jsonl").read_bytes()
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.zero_()
    assert trainer.validate() != summary["val"]
    assert trainer.validate(checkpoint="final") == summary["val"]  # the final weights put back
    assert (run / "metrics.jsonl").read_bytes() == before  # nothing written
    first = trainer.test(checkpoint=run / "checkpoints" / "step-16")
    assert first != summary["test"]
    assert trainer.test(checkpoint=run / "model.safetensors") == summary["test"]
