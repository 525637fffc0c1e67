"""Trainer(callbacks=[...]) (issue 29 §2): the hooks' order and arguments, a callback's stop, its state
across a resume, the EMA against a hand-computed average, and no host sync on a non-logging step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from gputrain import EMA, Callback, StopOnMetric, Trainer
from gputrain.data.tensors import TensorData
from gputrain.errors import Interrupted

QUIET = {
    "train.device": "cpu",
    "log.progress": "none",
    "log.tensorboard": False,
    "train.batch_size": 16,
    "train.epochs": 2,
    "log.every_steps": 3,
    "checkpoint.max_overhead": 0,  # every periodic save happens: the test counts them
}


def data(n: int = 64, seed: int = 0) -> TensorData:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorData(torch.randn(n, 6, generator=g) + 2 * F.one_hot(y, 6).float(), y)


def trainer(run_dir: Path, callbacks: list[Any], val: bool = True, **config: Any) -> Trainer:
    torch.manual_seed(0)
    return Trainer(
        nn.Linear(6, 3),
        data(),
        val_data=data(16, 1) if val else None,
        loss_fn=F.cross_entropy,
        config={**QUIET, **config},
        run_dir=run_dir,
        callbacks=callbacks,
    )


class Record(Callback):
    """Every hook's call, in order, with what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_fit_start(self, trainer: Trainer) -> None:
        self.calls.append(("fit_start", trainer.state.global_step))

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any] | None) -> None:
        assert step == trainer.state.global_step
        self.calls.append(("step", step, metrics))

    def on_eval_end(self, trainer: Trainer, split: str, metrics: dict[str, float]) -> None:
        self.calls.append(("eval", split, dict(metrics)))

    def on_checkpoint(self, trainer: Trainer, path: Path) -> None:
        self.calls.append(("checkpoint", path))

    def on_train_end(self, trainer: Trainer, status: str) -> None:
        self.calls.append(("train_end", status))

    def on_fit_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        self.calls.append(("fit_end", summary))


class StepsOnly:
    """A plain object with one hook: no base class needed."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any] | None) -> None:
        self.steps.append(step)


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_hooks_run_in_order_with_their_arguments(tmp_path: Path) -> None:
    record, plain = Record(), StepsOnly()
    run = tmp_path / "run"
    summary = trainer(run, [record, plain], **{"checkpoint.every_epochs": 1}).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 8
    kinds = [c[0] for c in record.calls]
    assert kinds == (
        ["fit_start"]
        + ["step"] * 4
        + ["eval", "checkpoint"]
        + ["step"] * 4
        + ["eval", "checkpoint"]
        + ["train_end", "fit_end"]
    )
    logged = {r["step"]: r for r in rows(run) if "split" not in r}
    for call in record.calls:
        if call[0] == "step":
            _, step, metrics = call
            # the logged row itself on a logging step (3, 6 and the last, 8), None on the others
            assert metrics == logged.get(step), step
    assert sorted(logged) == [3, 6, 8]
    evals = [c for c in record.calls if c[0] == "eval"]
    assert [c[1] for c in evals] == ["val", "val"] and evals[-1][2] == summary["val"]
    assert [c[1].name for c in record.calls if c[0] == "checkpoint"] == ["step-4", "step-8"]
    assert record.calls[-1] == ("fit_end", summary)
    assert ("train_end", "completed") in record.calls
    assert plain.steps == list(range(1, 9))


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any] | None) -> None:
        if step == self.step:
            trainer.request_stop(f"asked at {step}")


def test_a_stop_ends_the_run_stopped_early_with_a_checkpoint(tmp_path: Path, capsys: Any) -> None:
    record = Record()
    run = tmp_path / "run"
    # step 2: mid-epoch, not logged; no periodic checkpoint either: the stop's own is the one there
    summary = trainer(run, [StopAt(2), record], **{"log.progress": "plain", "checkpoint.every_epochs": 0}).fit()
    assert summary["status"] == "stopped_early" and summary["global_step"] == 2
    assert summary["stop_reason"] == "asked at 2"
    assert json.loads((run / "summary.json").read_text())["stop_reason"] == "asked at 2"
    assert (run / "checkpoints" / "step-2" / "COMMITTED").is_file() and (run / "model.safetensors").is_file()
    kinds = [c[0] for c in record.calls]
    # the stopped run is evaluated as at its end, then saved
    assert kinds == ["fit_start", "step", "step", "eval", "checkpoint", "train_end", "fit_end"]
    assert ("train_end", "stopped_early") in record.calls
    shown = capsys.readouterr()
    assert "early stop at step 2: asked at 2" in shown.out + shown.err


def test_stop_on_metric_stops_on_a_validation_threshold_and_on_patience(tmp_path: Path) -> None:
    summary = trainer(tmp_path / "a", [StopOnMetric("val_accuracy", mode="max", threshold=0.0)]).fit()
    assert summary["status"] == "stopped_early" and summary["global_step"] == 4  # the first validation
    assert summary["stop_reason"].startswith("val_accuracy ") and ">= 0" in summary["stop_reason"]
    # a loss that cannot improve by 10 in a step: patience 1 stops at the second logging step (6)
    summary = trainer(tmp_path / "b", [StopOnMetric("loss", patience=1, min_delta=10.0)], val=False).fit()
    assert summary["status"] == "stopped_early" and summary["global_step"] == 6
    assert "has not improved" in summary["stop_reason"]


def test_a_completed_run_without_a_stop_has_no_stop_reason(tmp_path: Path) -> None:
    summary = trainer(tmp_path / "a", [StopOnMetric("loss", threshold=-1.0)], val=False).fit()
    assert summary["status"] == "completed" and "stop_reason" not in summary


class Weights(Callback):
    """The weights after each step, copied."""

    def __init__(self) -> None:
        self.after: list[dict[str, torch.Tensor]] = []
        self.first: dict[str, torch.Tensor] = {}

    def on_fit_start(self, trainer: Trainer) -> None:
        self.first = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any] | None) -> None:
        self.after.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})


def test_ema_equals_a_hand_computed_average_and_is_evaluated_and_saved_beside(tmp_path: Path) -> None:
    ema, weights = EMA(decay=0.75), Weights()
    run = tmp_path / "run"
    summary = trainer(run, [ema, weights]).fit()
    expected = {n: w.clone() for n, w in weights.first.items()}
    for after in weights.after:  # ema + (1 - decay) * (w - ema), one lerp per tensor, step by step
        expected = {n: torch.lerp(expected[n], after[n], 0.25) for n in expected}
    assert len(weights.after) == 8 and ema.updates == 8
    averaged = ema.averaged()
    assert averaged.keys() == expected.keys()
    for name in expected:
        assert torch.equal(averaged[name], expected[name]), name
        assert not torch.equal(expected[name], weights.after[-1][name])  # it is an average, not the weights
    # saved beside the raw weights, each exactly as it was; the evaluations swapped the average back out
    assert all(torch.equal(v, expected[k]) for k, v in load_file(run / "model-ema.safetensors").items())
    assert all(torch.equal(v, weights.after[-1][k]) for k, v in load_file(run / "model.safetensors").items())
    splits = [r.get("split") for r in rows(run) if "split" in r]
    assert splits == ["val", "ema/val", "val", "ema/val"]
    assert {"loss", "ema/loss", "accuracy", "ema/accuracy"} <= set(summary["val"])
    with torch.no_grad():  # the average's own validation loss
        model = nn.Linear(6, 3)
        model.load_state_dict(expected)
        val = data(16, 1)
        assert summary["val"]["ema/loss"] == pytest.approx(F.cross_entropy(model(val.inputs), val.targets).item())


class Kill(Callback):
    """What a signal does at `step`: the run checkpoints and stops (interrupted)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any] | None) -> None:
        if step == self.step:
            trainer.stop.requested = "SIGTERM"


def test_a_resume_with_ema_equals_the_unbroken_run_bit_for_bit(tmp_path: Path) -> None:
    whole = EMA(decay=0.9)
    trainer(tmp_path / "whole", [whole, StopOnMetric("loss", patience=100)]).fit()
    first = EMA(decay=0.9)
    with pytest.raises(Interrupted):
        trainer(tmp_path / "broken", [first, StopOnMetric("loss", patience=100), Kill(5)]).fit()
    again, stop = EMA(decay=0.9), StopOnMetric("loss", patience=100)
    trainer(tmp_path / "broken", [again, stop, StepsOnly()]).fit()
    assert again.updates == whole.updates == 8
    for name, tensor in whole.averaged().items():
        assert torch.equal(again.averaged()[name], tensor), name
    assert (tmp_path / "broken" / "model-ema.safetensors").read_bytes() == (
        tmp_path / "whole" / "model-ema.safetensors"
    ).read_bytes()
    assert stop.best is not None  # its state came back too (the best of steps 3 and later)


def test_a_resume_with_other_callbacks_says_so_in_one_line(tmp_path: Path, gputrain_warnings: list[str]) -> None:
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        trainer(run, [EMA(), Kill(3)]).fit()
    summary = trainer(run, [StopOnMetric("loss", threshold=-1.0)]).fit()
    assert summary["status"] == "completed"
    assert [line for line in gputrain_warnings if "callbacks differ" in line] == [
        "resume: the callbacks differ from the checkpoint's: its state of EMA#0 is left out (no such callback "
        "in this run); StopOnMetric#0 starts fresh (no state saved)"
    ]


def test_a_state_key_keeps_the_state_across_a_change_of_the_list(tmp_path: Path, gputrain_warnings: list[str]) -> None:
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        trainer(run, [StepsOnly(), EMA(state_key="ema"), Kill(3)]).fit()
    again = EMA(state_key="ema")
    trainer(run, [again]).fit()  # at another place in the list, with no StepsOnly before it
    assert again.updates == 8 and not [line for line in gputrain_warnings if "callbacks differ" in line]


def test_callbacks_never_sync_on_a_non_logging_step() -> None:
    """The step's anatomy (benchmarks/step_anatomy.py) with EMA and StopOnMetric: their work is on the
    device; and the counter does see a callback that reads a weight on every step."""
    from tests.unit.train.test_step_anatomy import LOG_EVERY, STEPS, anatomy

    case = anatomy.CASES["mlp"]()
    quiet = anatomy.measure(
        case, "gputrain", False, STEPS, LOG_EVERY, callbacks=(EMA(), StopOnMetric("loss", patience=9))
    )
    assert quiet.syncs(logging=False) == 0
    assert quiet.syncs(logging=True) == 3  # a logging step's own three reads: StopOnMetric reads the row
    assert "aten::_foreach_lerp_" in quiet.quiet_step().ops  # the EMA did run in the counted step

    class Reads(Callback):
        def on_step_end(self, trainer: Trainer, step: int, metrics: dict[str, Any] | None) -> None:
            float(next(trainer.model.parameters()).detach().sum())

    loud = anatomy.measure(case, "gputrain", False, STEPS, LOG_EVERY, callbacks=(Reads(),))
    assert loud.syncs(logging=False) >= 1


def test_hook_dispatch_skips_what_no_callback_has() -> None:
    from gputrain.train.callbacks import Callbacks

    class Nothing(Callback):
        pass

    calls = Callbacks([Nothing(), StepsOnly()])
    assert [key for key, _ in calls.step_end] == ["StepsOnly#0"]  # the base's no-op is never called
    assert not Callbacks(None) and not Callbacks([]).step_end
