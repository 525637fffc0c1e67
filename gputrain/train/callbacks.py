"""Callbacks of `Trainer(..., callbacks=[...])`: the hooks a callback may have, and `Callbacks`,
which checks the list once and calls each hook's methods at the loop's call sites.

A callback is any object with at least one of these methods (each optional; subclassing `Callback`,
whose methods do nothing, works as well). Every hook is called on every rank, in list order:

    on_fit_start(trainer)                  after a resume (or the fresh start), before the first step
    on_step_end(trainer, step, metrics)    after each optimizer step; `metrics` is the logged row
                                           (host floats: loss, lr, grad_norm, samples_per_s, ...) on a
                                           logging step, None on every other step
    on_eval_end(trainer, split, metrics)   after each evaluation of "val" or "test"; `metrics` is the
                                           split's dict as summary.json holds it: a callback may add
                                           keys of its own (EMA adds `ema/<name>`), never change others
    on_checkpoint(trainer, path)           after each checkpoint is saved (with checkpoint.async_save it
                                           may still be written in the background)
    on_train_end(trainer, status)          after the last step, evaluation and test, before the final
                                           weights are written: completed and stopped_early only (a
                                           callback writes files beside model.safetensors here: EMA)
    on_fit_end(trainer, summary)           last, with summary.json's contents, however the run ended

What a hook may read without making the host wait for the device (a host sync), which it must never
do on a non-logging step (tests/unit/train/test_callbacks.py counts): everything in `trainer.state`
(host ints and floats: global_step, epoch, samples_seen, best_metric, ...), `metrics`, `trainer.config`,
`trainer.run_dir`, the optimizer's param_groups (lr). The model's parameters and buffers are device
tensors: work on them on the device (as EMA does) and never `.item()`, `float()`, `.cpu()` or compare
them in Python outside a logging step, an evaluation or a checkpoint, which sync anyway.

Which hooks run at each ending: completed and stopped_early run on_train_end then on_fit_end;
interrupted (a signal: a checkpoint was saved, so on_checkpoint ran) and failed run on_fit_end
only, with the summary's status and error; there the ranks may have ended apart, so on_fit_end must
not call collectives, and a failure inside it is logged, not raised, so the run's own error is the
one the caller sees (a second signal leaves at once, with no hook). A completed run's on_fit_end
runs once summary.json is written: a failure there is raised, and the record stays as the run
ended. on_fit_start, on_step_end, on_eval_end, on_checkpoint and on_train_end run on every rank
together: they may call collectives.

A stop: `trainer.request_stop(reason)` from any hook (on any rank) ends the run `stopped_early`
after a checkpoint, the reason on the console and in summary.json's `stop_reason`. Several ranks
agree at the next logging step or evaluation (the all-reduce that agrees a signal's stop, run/
signals.py), so none is left waiting in a collective; one process stops after the current step.

State: a callback with `state_dict()` and `load_state_dict(state)` is saved in each checkpoint's
state.pt (under "callbacks", keyed by its `state_key` attribute, else `ClassName#k`, the k-th of its
class in the list) and restored on resume; a resume whose checkpoint holds state for callbacks the
run no longer has, or none for one it has, says so in one line. A state holds tensors, numbers,
strings, None, lists, tuples and dicts (what state.pt may load back); it is taken on every rank, and
rank 0's is saved: a callback whose state differs by rank gathers it (EMA does, under FSDP and TP).

A failure in a hook ends the run `failed`, its one-line message naming the callback and the hook.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gputrain.errors import GputrainError, RunError, UsageError, first_line
from gputrain.train.state import LoopState

log = logging.getLogger("gputrain")

HOOKS = ("on_fit_start", "on_step_end", "on_eval_end", "on_checkpoint", "on_train_end", "on_fit_end")


class TrainerView(Protocol):
    """What a hook is given: the `gputrain.Trainer` itself (train/trainer.py, which imports this
    module), seen through what callbacks read of it."""

    @property
    def config(self) -> Any: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def state(self) -> LoopState: ...
    @property
    def stop(self) -> Any: ...
    @property
    def parts(self) -> Any: ...
    @property
    def shell(self) -> Any: ...
    @property
    def val_data(self) -> Any: ...
    @property
    def test_data(self) -> Any: ...
    def request_stop(self, reason: str) -> None: ...


class Callback:
    """A base with every hook doing nothing: override the ones you need (see the module docstring
    for when each runs and what it may read). `state_key`: the name its state has in checkpoints
    (default `ClassName#k`); set it to keep a callback's state across a change of the list."""

    state_key: str | None = None

    def on_fit_start(self, trainer: TrainerView) -> None:
        """After a resume (or the fresh start), before the first step."""

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any] | None) -> None:
        """After optimizer step `step`; `metrics`: the logged row on a logging step, else None."""

    def on_eval_end(self, trainer: TrainerView, split: str, metrics: dict[str, float]) -> None:
        """After an evaluation of `split` ("val", "test")."""

    def on_checkpoint(self, trainer: TrainerView, path: Path) -> None:
        """After a checkpoint was saved at `path`."""

    def on_train_end(self, trainer: TrainerView, status: str) -> None:
        """Before the final weights are written (completed, stopped_early)."""

    def on_fit_end(self, trainer: TrainerView, summary: dict[str, Any]) -> None:
        """Last, with summary.json's contents, however the run ended."""


_NO_OP = {name: getattr(Callback, name) for name in HOOKS}
"""The base's do-nothing methods: a subclass that keeps one costs no call at all."""

_STATE_TYPES = (torch.Tensor, str, int, float, bool, type(None))


class Callbacks:
    """The run's callbacks, checked once: each hook's bound methods listed in advance, so a hook no
    callback has costs one test of an empty list in the loop. Also the part of the checkpoint that
    holds their state (run/shell.py's `states=`: `state_dict` / `load_state_dict`).

    Raises:
        UsageError: `callbacks` is not a list of objects with at least one hook, a hook
            or state method is not callable, or two callbacks share a state key.
    """

    def __init__(self, callbacks: Iterable[Any] | None) -> None:
        if callbacks is None:
            callbacks = ()
        if isinstance(callbacks, (str, bytes, Mapping)) or not isinstance(callbacks, Iterable):
            raise UsageError(
                f"callbacks: takes a list of callback objects (callbacks=[EMA()]), not a {type(callbacks).__name__}"
            )
        self.items: list[tuple[str, Any]] = []
        """(state key, callback), in list order."""
        counts: dict[str, int] = {}
        for index, callback in enumerate(callbacks):
            hooks = [name for name in HOOKS if getattr(callback, name, None) is not None]
            has_state = hasattr(callback, "state_dict") or hasattr(callback, "load_state_dict")
            if isinstance(callback, type) or not hooks:  # a state alone (a module passed by mistake) is no callback
                what = f"the class {callback.__name__}" if isinstance(callback, type) else type(callback).__name__
                raise UsageError(
                    f"callbacks[{index}]: {what} has none of the hooks {', '.join(HOOKS)}: pass an "
                    "instance with at least one (or a subclass of gputrain.Callback)"
                )
            for name in hooks + [n for n in ("state_dict", "load_state_dict") if hasattr(callback, n)]:
                if not callable(getattr(callback, name)):
                    raise UsageError(f"callbacks[{index}]: {type(callback).__name__}.{name} is not callable")
            if has_state and not (hasattr(callback, "state_dict") and hasattr(callback, "load_state_dict")):
                raise UsageError(
                    f"callbacks[{index}]: {type(callback).__name__} has only one of state_dict and "
                    "load_state_dict: a state that is saved must be restored (give it both, or neither)"
                )
            key = getattr(callback, "state_key", None)
            if key is None:
                cls = type(callback).__name__
                key = f"{cls}#{counts.get(cls, 0)}"
                counts[cls] = counts.get(cls, 0) + 1
            if not isinstance(key, str) or not key:
                raise UsageError(f"callbacks[{index}]: state_key must be a non-empty string, not {key!r}")
            if any(key == other for other, _ in self.items):
                raise UsageError(f"callbacks[{index}]: a second callback with state key {key!r}: give each a state_key")
            self.items.append((key, callback))
        self._calls = {name: self._bound(name) for name in HOOKS}
        self.step_end = self._calls["on_step_end"]
        """The step's hook, read by the loop on every step (an empty list: nothing to call)."""
        self.started = False
        """on_fit_start has run: on_fit_end runs only then (not for a complete run kept as it was)."""
        self._stateful = [(key, cb) for key, cb in self.items if hasattr(cb, "state_dict")]

    def _bound(self, hook: str) -> list[tuple[str, Callable[..., Any]]]:
        calls = []
        for key, callback in self.items:
            method = getattr(callback, hook, None)
            if method is None or getattr(method, "__func__", None) is _NO_OP[hook]:  # the base's own no-op
                continue
            calls.append((key, method))
        return calls

    def __bool__(self) -> bool:
        return bool(self.items)

    # ----------------------------------------------------------------- the call sites
    def call(self, hook: str, trainer: TrainerView, *args: Any) -> None:
        """Call `hook` of every callback that has it; a failure becomes one line naming both."""
        for key, method in self._calls[hook]:
            try:
                method(trainer, *args)
            except GputrainError:
                raise  # gputrain's own errors (StopOnMetric's, EMA's) are one line naming their source
            except Exception as err:
                raise _failed(key, hook, err, trainer) from err

    def step_ended(self, trainer: TrainerView, step: int, metrics: dict[str, Any] | None) -> None:
        for key, method in self.step_end:
            try:
                method(trainer, step, metrics)
            except GputrainError:
                raise
            except Exception as err:
                raise _failed(key, "on_step_end", err, trainer) from err

    def fit_started(self, trainer: TrainerView) -> None:
        self.started = True
        self.call("on_fit_start", trainer)

    def fit_ended(self, trainer: TrainerView, summary: dict[str, Any] | None, failing: bool) -> None:
        """on_fit_end with the summary. `failing`: the run is raising (interrupted, failed): a
        failure here is logged and the run's own error goes on."""
        if not self.started or summary is None:
            return
        if not failing:
            self.call("on_fit_end", trainer, summary)
            return
        for key, method in self._calls["on_fit_end"]:
            try:
                method(trainer, summary)
            except Exception as err:  # noqa: BLE001 - the run's own error is the one raised
                log.warning("%s", _failed(key, "on_fit_end", err, trainer))

    # ----------------------------------------------------------------- their state in checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Each stateful callback's state by key (state.pt's "callbacks"), checked for what state.pt loads."""
        states: dict[str, Any] = {}
        for key, callback in self._stateful:
            try:
                state = callback.state_dict()
            except Exception as err:
                raise RunError(f"callback {key}: state_dict() failed: {type(err).__name__}: {first_line(err)}") from err
            if not isinstance(state, dict):
                raise RunError(f"callback {key}: state_dict() returned a {type(state).__name__}: it must return a dict")
            bad = _unsaveable(state, "")
            if bad is not None:
                where, kind = bad
                raise RunError(
                    f"callback {key}: state_dict(){where} is a {kind}: a checkpoint's state holds tensors, "
                    "numbers, strings, None, lists, tuples and dicts"
                )
            states[key] = state
        return states

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Give each callback its saved state; say in one line which states the checkpoint holds
        for callbacks this run lacks, and which of this run's callbacks it holds none for."""
        saved = saved if isinstance(saved, dict) else {}
        mine = dict(self._stateful)
        dropped = sorted(set(saved) - set(mine))
        fresh = sorted(set(mine) - set(saved))
        if dropped or fresh:
            parts = []
            if dropped:
                parts.append(f"its state of {', '.join(dropped)} is left out (no such callback in this run)")
            if fresh:
                parts.append(f"{', '.join(fresh)} start{'s' if len(fresh) == 1 else ''} fresh (no state saved)")
            log.warning("resume: the callbacks differ from the checkpoint's: %s", "; ".join(parts))
        for key, callback in self._stateful:
            if key in saved:
                try:
                    callback.load_state_dict(saved[key])
                except Exception as err:
                    raise RunError(
                        f"callback {key}: load_state_dict() failed on the checkpoint's state: "
                        f"{type(err).__name__}: {first_line(err)}"
                    ) from err


def _failed(key: str, hook: str, err: Exception, trainer: TrainerView) -> RunError:
    step = trainer.state.global_step
    return RunError(f"callback {key} failed in {hook} at step {step}: {type(err).__name__}: {first_line(err)}")


def _unsaveable(value: Any, where: str) -> tuple[str, str] | None:
    """(where, what) of the first value state.pt could not load back, or None."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                return f"{where} key {k!r}", type(k).__name__
            bad = _unsaveable(v, f"{where}[{k!r}]")
            if bad is not None:
                return bad
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            bad = _unsaveable(v, f"{where}[{i}]")
            if bad is not None:
                return bad
        return None
    if isinstance(value, _STATE_TYPES):
        return None
    return where, type(value).__name__
