"""StopOnMetric: a Trainer callback (train/callbacks.py) that stops the run when a metric reaches a
threshold, stops improving for `patience` checks, or is not finite: Lightning's EarlyStopping with
its `stopping_threshold`, on a logged training figure as well as on a validation metric.

It reads only what the loop has on the host already: a logging step's row (`loss`, `grad_norm`,
`lr`, `samples_per_s`, ...) or a validation's metrics (`val_<metric>`: `val_loss`, `val_accuracy`;
`val_ema/loss` with an EMA callback before it in the list). Its best value and count of checks
without improvement are in checkpoints, so a resumed run goes on counting where it stopped.
"""

from __future__ import annotations

import math
from typing import Any

from gputrain.errors import UsageError
from gputrain.train.callbacks import Callback, TrainerView

VAL = "val_"


class StopOnMetric(Callback):
    """Stop the run (status stopped_early, a checkpoint saved) on a metric.

    Args:
        metric: a logged step's field (`loss`, `grad_norm`, ...) or `val_<metric>` (`val_loss`).
        mode: "min" (lower is better) or "max".
        threshold: stop once the metric is at or past it (at most it for min, at least for max).
        patience: stop after this many checks (logging steps, or validations) without an improvement
            of more than `min_delta` on the best value.
        min_delta: how much better than the best a value must be to count as an improvement.
        state_key: its name in checkpoints (default `StopOnMetric#k`).

    At least one of `threshold` and `patience`. A value that is not finite stops the run too.
    """

    def __init__(
        self,
        metric: str,
        *,
        mode: str = "min",
        threshold: float | None = None,
        patience: int | None = None,
        min_delta: float = 0.0,
        state_key: str | None = None,
    ) -> None:
        where = f"StopOnMetric({metric!r})"
        if not isinstance(metric, str) or not metric or metric == VAL:
            raise UsageError(f"StopOnMetric(metric={metric!r}): name a logged figure (loss) or val_<metric> (val_loss)")
        if mode not in ("min", "max"):
            raise UsageError(f"{where}: mode={mode!r}: must be 'min' or 'max'")
        if threshold is None and patience is None:
            raise UsageError(f"{where}: give a threshold, a patience, or both")
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold)
        ):
            raise UsageError(f"{where}: threshold={threshold!r}: must be a finite number")
        if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
            raise UsageError(f"{where}: patience={patience!r}: must be a whole number of checks, 1 or more")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not min_delta >= 0:
            raise UsageError(f"{where}: min_delta={min_delta!r}: must be a number, 0 or more")
        self.metric, self.mode, self.threshold, self.patience = metric, mode, threshold, patience
        self.min_delta = float(min_delta)
        self.state_key = state_key
        self.best: float | None = None
        self.checks_without_improvement = 0
        self._checked_name = False

    def on_fit_start(self, trainer: TrainerView) -> None:
        if not self.metric.startswith(VAL):
            return  # a step row's fields are known at the first logging step
        if trainer.val_data is None:
            raise UsageError(f"StopOnMetric({self.metric!r}): the Trainer has no val_data to take it from")
        name = self.metric.removeprefix(VAL).removeprefix("ema/")
        names = trainer.parts.evaluator.spec.metric_names
        if name not in names:
            raise UsageError(
                f"StopOnMetric({self.metric!r}): not a validation metric of this run; it has "
                + ", ".join(VAL + n for n in names)
            )

    def on_step_end(self, trainer: TrainerView, step: int, metrics: dict[str, Any] | None) -> None:
        if metrics is None or self.metric.startswith(VAL):
            return
        if not self._checked_name and self.metric not in metrics:
            figures = [k for k, v in metrics.items() if isinstance(v, (int, float)) and k not in ("step", "epoch")]
            raise UsageError(
                f"StopOnMetric({self.metric!r}): not a logged figure; a logged step has {', '.join(figures)} "
                "(or name a validation metric: val_loss)"
            )
        self._checked_name = True
        self._check(trainer, metrics[self.metric], f"at step {step}")

    def on_eval_end(self, trainer: TrainerView, split: str, metrics: dict[str, float]) -> None:
        if split == "val" and self.metric.startswith(VAL):
            value = metrics.get(self.metric.removeprefix(VAL))
            if value is not None:
                self._check(trainer, value, f"after the validation at step {trainer.state.global_step}")

    def _check(self, trainer: TrainerView, value: Any, when: str) -> None:
        if value is None:
            return
        value = float(value)
        better = (lambda a, b: a < b - self.min_delta) if self.mode == "min" else (lambda a, b: a > b + self.min_delta)
        if not math.isfinite(value):
            trainer.request_stop(f"{self.metric} is {value} {when}")
            return
        if self.threshold is not None and (value <= self.threshold if self.mode == "min" else value >= self.threshold):
            sign = "<=" if self.mode == "min" else ">="
            trainer.request_stop(f"{self.metric} {value:.6g} {sign} {self.threshold:g} {when}")
            return
        if self.best is None or better(value, self.best):
            self.best, self.checks_without_improvement = value, 0
            return
        self.checks_without_improvement += 1
        if self.patience is not None and self.checks_without_improvement >= self.patience:
            trainer.request_stop(
                f"{self.metric} has not improved on {self.best:.6g} for {self.patience} checks ({when})"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "checks_without_improvement": self.checks_without_improvement}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state.get("best")
        self.checks_without_improvement = int(state.get("checks_without_improvement", 0))
