"""Trainer callbacks a user gets wrong (issue 29 §2): a callback that raises in each hook, objects that
are no callbacks, states that a checkpoint cannot hold, EMA and StopOnMetric given what cannot work.
The answers: a list that cannot work is refused at Trainer(...) in one line, before anything is
written; a failure inside a run ends it `failed` with summary.json left and a one-line message naming
the callback and the hook (or, for a state, the callback and state_dict)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gputrain import EMA, Callback, StopOnMetric, Trainer
from gputrain.errors import Interrupted, RunError, UsageError
from tests.adversarial.helpers import QUIET, linear_data, read_summary

HOOKS = ("on_fit_start", "on_step_end", "on_eval_end", "on_checkpoint", "on_train_end", "on_fit_end")


def trainer(run_dir: Path, callbacks: Any, val: bool = True, **config: Any) -> Trainer:
    torch.manual_seed(0)
    return Trainer(
        nn.Linear(6, 3),
        linear_data(),
        val_data=linear_data(16) if val else None,
        loss_fn=F.cross_entropy,
        config={**QUIET, **config},
        run_dir=run_dir,
        callbacks=callbacks,
    )


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text, text
    return text


class Raises(Callback):
    def __init__(self, hook: str) -> None:
        setattr(self, hook, self._raise)

    def _raise(self, *args: Any) -> None:
        raise ValueError("the callback's own bug")


# ----------------------------------------------------------------------------- a hook that raises
@pytest.mark.parametrize("hook", HOOKS[:-1])
def test_a_hook_that_raises_fails_the_run_naming_the_callback_and_the_hook(tmp_path: Path, hook: str) -> None:
    with pytest.raises(RunError) as err:
        trainer(tmp_path / "run", [Raises(hook)]).fit()
    message = one_line(err.value)
    assert message.startswith(f"callback Raises#0 failed in {hook} at step ")
    assert message.endswith("ValueError: the callback's own bug")
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "failed" and summary["error"] == message
    assert "ValueError: the callback's own bug" in (tmp_path / "run" / "error.log").read_text()
    assert not (tmp_path / "run" / "model.safetensors").exists()  # the run did not end: no final weights


def test_on_fit_end_that_raises_is_named_and_the_record_stays_as_the_run_ended(tmp_path: Path) -> None:
    """on_fit_end runs once summary.json is written: the run completed, its weights are saved; the
    caller is told of the callback's failure in one line."""
    with pytest.raises(RunError) as err:
        trainer(tmp_path / "run", [Raises("on_fit_end")]).fit()
    assert one_line(err.value).startswith("callback Raises#0 failed in on_fit_end at step 8: ValueError")
    assert read_summary(tmp_path / "run")["status"] == "completed"
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_on_fit_end_that_raises_in_a_failing_run_leaves_the_runs_own_error(
    tmp_path: Path, gputrain_warnings: list[str]
) -> None:
    with pytest.raises(RunError) as err:
        trainer(tmp_path / "run", [Raises("on_step_end"), Raises("on_fit_end")]).fit()
    assert "Raises#0 failed in on_step_end" in one_line(err.value)
    assert any("Raises#1 failed in on_fit_end" in line for line in gputrain_warnings)


class Kill(Callback):
    def on_step_end(self, trainer: Trainer, step: int, metrics: Any) -> None:
        if step == 2:
            trainer.stop.requested = "SIGTERM"


def test_on_fit_end_sees_an_interrupted_run(tmp_path: Path, handlers: None) -> None:
    seen: list[str] = []

    class Ends(Callback):
        def on_fit_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
            seen.append(summary["status"])

    with pytest.raises(Interrupted):
        trainer(tmp_path / "run", [Kill(), Ends()]).fit()
    assert seen == ["interrupted"]


# ----------------------------------------------------------------------------- objects that are no callbacks
class NoHooks:
    pass


class NotCallable:
    on_step_end = 3


class SaveOnly:
    def on_step_end(self, trainer: Trainer, step: int, metrics: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}


def _lambda(*args: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("callbacks", "expected"),
    [
        ([3], "callbacks[0]: int has none of the hooks"),
        (["ema"], "callbacks[0]: str has none of the hooks"),
        ([NoHooks()], "callbacks[0]: NoHooks has none of the hooks"),
        ([_lambda], "callbacks[0]: function has none of the hooks"),
        ([EMA], "callbacks[0]: the class EMA has none of the hooks"),  # the class, not an instance
        ([nn.Linear(2, 2)], "callbacks[0]: Linear has none of the hooks"),  # a state_dict alone: no callback
        ([EMA(), Callback, EMA()], "callbacks[1]: the class Callback"),
        (EMA(), "callbacks: takes a list of callback objects (callbacks=[EMA()]), not a EMA"),
        ("EMA", "callbacks: takes a list of callback objects (callbacks=[EMA()]), not a str"),
        ({"ema": EMA()}, "callbacks: takes a list of callback objects (callbacks=[EMA()]), not a dict"),
        ([NotCallable()], "callbacks[0]: NotCallable.on_step_end is not callable"),
        ([SaveOnly()], "callbacks[0]: SaveOnly has only one of state_dict and load_state_dict"),
        ([EMA(state_key="a"), EMA(state_key="a")], "callbacks[1]: a second callback with state key 'a'"),
        ([EMA(state_key="")], "callbacks[0]: state_key must be a non-empty string"),
    ],
    ids=[
        "int",
        "str-item",
        "no-hooks",
        "function",
        "class",
        "module",
        "base-class",
        "single-callback",
        "str",
        "dict",
        "hook-not-callable",
        "state-without-load",
        "same-state-key",
        "empty-state-key",
    ],
)
def test_what_is_no_callback_is_refused_at_once_writing_nothing(tmp_path: Path, callbacks: Any, expected: str) -> None:
    with pytest.raises(UsageError) as err:
        trainer(tmp_path / "run", callbacks)
    assert one_line(err.value).startswith(expected), str(err.value)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- states a checkpoint cannot hold
class State(Callback):
    def __init__(self, state: Any, state_key: str | None = None) -> None:
        self.state = state
        self.state_key = state_key

    def on_step_end(self, trainer: Trainer, step: int, metrics: Any) -> None:
        pass

    def state_dict(self) -> Any:
        if isinstance(self.state, Exception):
            raise self.state
        return self.state

    def load_state_dict(self, state: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ([1, 2], "callback State#0: state_dict() returned a list: it must return a dict"),
        (None, "callback State#0: state_dict() returned a NoneType: it must return a dict"),
        ({"seen": {1, 2}}, "callback State#0: state_dict()['seen'] is a set"),
        ({"fn": _lambda}, "callback State#0: state_dict()['fn'] is a function"),
        ({"deep": [{"x": object()}]}, "callback State#0: state_dict()['deep'][0]['x'] is a object"),
        ({"model": nn.Linear(2, 2)}, "callback State#0: state_dict()['model'] is a Linear"),
        ({(1, 2): 3}, "callback State#0: state_dict() key (1, 2) is a tuple"),
        (KeyError("broken"), "callback State#0: state_dict() failed: KeyError: 'broken'"),
    ],
    ids=["list", "none", "set", "function", "nested-object", "module", "tuple-key", "raises"],
)
def test_a_state_a_checkpoint_cannot_hold_fails_the_run_at_its_first_save(
    tmp_path: Path, state: Any, expected: str
) -> None:
    with pytest.raises(RunError) as err:
        trainer(tmp_path / "run", [State(state)]).fit()
    assert one_line(err.value).startswith(expected), str(err.value)
    assert read_summary(tmp_path / "run")["status"] == "failed"
    assert not list((tmp_path / "run" / "checkpoints").glob("step-*"))  # nothing half saved


def test_a_load_state_dict_that_raises_on_resume_names_the_callback(tmp_path: Path, handlers: None) -> None:
    class Picky(State):
        def load_state_dict(self, state: Any) -> None:
            raise ValueError("not my format")

    with pytest.raises(Interrupted):
        trainer(tmp_path / "run", [State({"n": 1}, "mine"), Kill()]).fit()
    with pytest.raises(RunError) as err:
        trainer(tmp_path / "run", [Picky({"n": 1}, "mine")]).fit()
    message = one_line(err.value)
    assert "callback mine: load_state_dict() failed on the checkpoint's state: ValueError: not my format" in message


def test_tensors_numbers_and_strings_are_a_state_that_comes_back(tmp_path: Path, handlers: None) -> None:
    state = {"t": torch.arange(3.0), "n": 2, "x": 0.5, "s": "text", "l": [None, True, (1, "a")], "d": {1: "one"}}
    with pytest.raises(Interrupted):
        trainer(tmp_path / "run", [State(state, "mine"), Kill()]).fit()
    got: list[Any] = []

    class Back(State):
        def load_state_dict(self, state: Any) -> None:
            got.append(state)

    trainer(tmp_path / "run", [Back(state, "mine")]).fit()
    assert torch.equal(got[0].pop("t"), state["t"]) and got[0] == {k: v for k, v in state.items() if k != "t"}


# ----------------------------------------------------------------------------- EMA and StopOnMetric given nonsense
@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1, math.nan, math.inf, "0.9", True, None])
def test_ema_decay_out_of_range_is_refused_at_construction(decay: Any) -> None:
    with pytest.raises(UsageError) as err:
        EMA(decay=decay)
    assert one_line(err.value) == f"EMA(decay={decay!r}): must be a number between 0 and 1, exclusive (0.999 is usual)"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"metric": "loss", "mode": "lowest", "threshold": 1.0}, "StopOnMetric('loss'): mode='lowest'"),
        ({"metric": "loss"}, "StopOnMetric('loss'): give a threshold, a patience, or both"),
        ({"metric": "loss", "patience": 0}, "StopOnMetric('loss'): patience=0: must be a whole number"),
        ({"metric": "loss", "patience": 1.5}, "StopOnMetric('loss'): patience=1.5"),
        ({"metric": "loss", "threshold": math.nan}, "StopOnMetric('loss'): threshold=nan: must be a finite number"),
        ({"metric": "loss", "threshold": "0.1"}, "StopOnMetric('loss'): threshold='0.1'"),
        ({"metric": "loss", "patience": 2, "min_delta": -1}, "StopOnMetric('loss'): min_delta=-1"),
        ({"metric": "", "threshold": 1.0}, "StopOnMetric(metric=''): name a logged figure"),
        ({"metric": 3, "threshold": 1.0}, "StopOnMetric(metric=3): name a logged figure"),
    ],
    ids=[
        "mode",
        "neither",
        "patience-0",
        "patience-float",
        "threshold-nan",
        "threshold-str",
        "min-delta",
        "empty",
        "not-str",
    ],
)
def test_stop_on_metric_refuses_what_cannot_work_at_construction(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(UsageError) as err:
        StopOnMetric(**kwargs)
    assert one_line(err.value).startswith(expected), str(err.value)


@pytest.mark.parametrize(
    ("metric", "val", "expected"),
    [
        ("losss", True, "StopOnMetric('losss'): not a logged figure; a logged step has loss, lr, grad_norm"),
        ("val_nope", True, "StopOnMetric('val_nope'): not a validation metric of this run; it has val_accuracy"),
        ("val_loss", False, "StopOnMetric('val_loss'): the Trainer has no val_data to take it from"),
    ],
    ids=["step-figure", "val-metric", "no-val-data"],
)
def test_stop_on_metric_on_an_unknown_name_fails_at_the_first_check_in_one_line(
    tmp_path: Path, metric: str, val: bool, expected: str
) -> None:
    with pytest.raises(UsageError) as err:
        trainer(tmp_path / "run", [StopOnMetric(metric, threshold=0.0)], val=val).fit()
    assert one_line(err.value).startswith(expected), str(err.value)
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "failed" and summary["global_step"] <= 1


def test_a_stop_asked_in_the_test_evaluation_leaves_the_run_completed(tmp_path: Path) -> None:
    class LateStop(Callback):
        def on_eval_end(self, trainer: Trainer, split: str, metrics: dict[str, float]) -> None:
            if split == "test":
                trainer.request_stop("too late")

    run = tmp_path / "run"
    t = Trainer(
        nn.Linear(6, 3),
        linear_data(),
        test_data=linear_data(16),
        loss_fn=F.cross_entropy,
        config=QUIET,
        run_dir=run,
        callbacks=[LateStop()],
    )
    summary = t.fit()
    assert summary["status"] == "completed" and "stop_reason" not in summary


def test_a_stop_on_a_non_finite_loss(tmp_path: Path) -> None:
    """train.on_nonfinite=off lets a NaN loss through; StopOnMetric stops on it."""

    def nan_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets) * math.nan

    run = tmp_path / "run"
    summary = Trainer(
        nn.Linear(6, 3),
        linear_data(),
        loss_fn=nan_loss,
        config={**QUIET, "train.on_nonfinite": "off"},
        run_dir=run,
        callbacks=[StopOnMetric("loss", patience=5)],
    ).fit()
    assert summary["status"] == "stopped_early" and summary["global_step"] == 1
    assert summary["stop_reason"] == "loss is nan at step 1"
