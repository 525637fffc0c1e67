"""The Trainer: its parts come from build.py; `fit` is the loop.

Trainer.fit → train_step → forward_backward (step.py). The loop touches the host only on logging
steps, checkpoints and evaluations; every way a run can end leaves summary.json behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gputrain.config import Config, load_config
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import as_tensor_data
from gputrain.errors import UsageError
from gputrain.evaluate.scores import save_scores
from gputrain.observe.own_sync import own_sync
from gputrain.observe.profiler import ProfileReport, profile_run
from gputrain.run.layout import scores_name
from gputrain.run.record import LoopFigures
from gputrain.run.shell import LoopShape, RunShell
from gputrain.train.build import UserTPPlan, build_model_and_data, build_training, profile_target
from gputrain.train.cadence import TIMED_OUT, check_cadence, validation_due_mid_epoch
from gputrain.train.nonfinite import BadStep, note_bad_steps
from gputrain.train.smoke import finish_smoke
from gputrain.train.standalone import load_checkpoint_weights
from gputrain.train.step import StepResult, train_step
from gputrain.train.tasks import ComputeLoss, LossFn

ConfigLike = Config | Mapping[str, Any] | str | Path | None

_IN_PARTS = {
    "place": "parts.place",
    "device": "parts.place.device",
    "dist": "parts.place.dist",
    "task": "parts.task",
    "precision": "parts.precision",
    "step_parts": "parts.step",
    "feed": "parts.feed",
    "speed": "parts.speed",
    "evaluator": "parts.evaluator",
    "early_stopping": "parts.early_stopping",
    "checkpointer": "parts.checkpointer",
    "metrics": "parts.metrics",
    "console": "parts.console",
    "global_batch": "parts.global_batch",
    "total_steps": "parts.total_steps",
}
"""Attributes a Trainer had before it kept its parts in one place: where each is now."""


class Trainer:
    """Train any `nn.Module` on a Dataset or DataLoader with the config's practices.

    Args:
        model: the module to train; one on the meta device (or a zero-argument function that builds
            one, called on meta) is parallelised there and each rank materialises only its own part,
            with `to_empty` and each module's `reset_parameters` (then the root's `init_steps()`
            where it has one), drawn as an eager build would have from the global generator.
        train_data: a Dataset (gputrain builds the loader from `train.batch_size`) or a DataLoader
            (its batches are the micro-batches).
        loss_fn: `loss_fn(outputs, targets)` for batches of (inputs, targets); default from the task. A
            model returning a Hugging Face ModelOutput has its `.logits` read; dict batches go to
            `model(**batch)`, whose `.loss` is the loss.
        step_fn: `step_fn(model, batch) -> loss` for any other batch structure; validation and test
            then report its loss (no grad, eval mode), or `eval_fn`'s where given.
        eval_fn: `eval_fn(model, batch) -> loss` for evaluation, where it should differ from step_fn.
        val_data, test_data: validated every `eval.every_epochs` epochs and every `eval.every_steps`
            steps (train/cadence.py), and at the end, where test_data is evaluated once (not after
            a stop by `train.max_time`); `validate()` and `test()` evaluate them on their own.
        config: a Config, a dict of dotted keys, or a TOML path.
        run_dir: where the run's files go (default `runs/<model>-<data>-<time>/`).
        tp_plan: for `parallel.strategy=tp` with a model of your own: {module name: ColwiseParallel(),
            ...} (torch.distributed.tensor.parallel), or a function (module, tp degree) -> that dict.

    Attributes:
        config: the run's config, with train.batch_size=auto resolved (what config.toml records).
        model: the module holding this rank's parameters.
        optimizer, scheduler: the run's optimizer and LR schedule.
        run_dir: where the run's files go.
        state: the loop's counters (global_step, epoch, best_step, ...), current during `fit`.
        val, test_metrics: the metrics of `fit`'s last validation and of its test (summary.json).
        stop: the signal handler (setting `stop.requested` stops the run as a signal would).
        parts: every part of the run, built (train/build.py's TrainingParts: the step, the feed, the
            evaluator, the checkpointer, the metrics logger, where the run executes, ...).

    Raises:
        UsageError (ConfigError, DataError): bad config or input, before anything heavy starts.
    """

    def __init__(
        self,
        model: nn.Module | Callable[[], nn.Module],
        train_data: Dataset | DataLoader,
        *,
        loss_fn: LossFn | None = None,
        step_fn: ComputeLoss | None = None,
        eval_fn: ComputeLoss | None = None,
        val_data: Dataset | DataLoader | None = None,
        test_data: Dataset | DataLoader | None = None,
        config: ConfigLike = None,
        run_dir: str | Path | None = None,
        spec: DataSpec | None = None,
        names: tuple[str, str] | None = None,
        tp_plan: UserTPPlan | None = None,
    ) -> None:
        self.parts = parts = build_training(
            config if isinstance(config, Config) else load_config(config),
            model,
            train_data,
            loss_fn=loss_fn,
            step_fn=step_fn,
            eval_fn=eval_fn,
            spec=spec,
            run_dir=run_dir,
            names=names,
            tp_plan=tp_plan,
        )
        self.config = parts.place.config
        self.model, self.optimizer, self.scheduler, self.run_dir = (
            parts.model,
            parts.optimizer,
            parts.scheduler,
            parts.run_dir,
        )
        self.val_data, self.test_data = as_tensor_data(val_data), as_tensor_data(test_data)
        check_cadence(self.config, self.val_data is not None)
        for split, data in (("val", self.val_data), ("test", self.test_data)):
            if data is not None:  # a split its evaluation cannot take fails now, not after an epoch
                parts.evaluator.check(data, split)
        self.val: dict[str, float] = {}
        self.test_metrics: dict[str, float] = {}
        """The last validation's and the test's metrics (summary.json); `test()` is the method that
        evaluates test_data on its own."""
        self._last: StepResult | None = None
        self._reason: str | None = None
        """Why the run stopped where summary.json says (train.max_time)."""
        task = parts.task
        shape = LoopShape(
            total=parts.total_steps,
            meta={"task": task.kind, "num_classes": task.num_classes},
            before_save=self._before_save,
        )
        self.shell = RunShell(parts, self.config, shape, self._figures)
        self.state, self.stop = self.shell.state, self.shell.stop

    def __getattr__(self, name: str) -> Any:
        # only for names not found the usual way: one a Trainer used to have says where it is now
        where = _IN_PARTS.get(name)
        if where is not None:
            raise AttributeError(f"'Trainer' object has no attribute {name!r}: it is trainer.{where}")
        raise AttributeError(f"'Trainer' object has no attribute {name!r}")

    @classmethod
    def from_config(
        cls,
        config: ConfigLike = None,
        run_dir: str | Path | None = None,
        overrides: Mapping[str, Any] | list[str] | None = None,
        evaluate: bool = True,
    ) -> Trainer:
        """Build model and data from the registries (what `gputrain train` does); `evaluate=False`
        leaves the validation and test splits out (a profile times training steps only)."""
        cfg = config if isinstance(config, Config) and not overrides else load_config(config, overrides or ())
        if not evaluate and cfg.eval.every_steps:  # no validation split: no cadence of validations to keep
            cfg = load_config(cfg, {"eval.every_steps": 0})
        model, data = build_model_and_data(cfg, run_dir)
        val, test = (data.val, data.test) if evaluate else (None, None)
        names = (cfg.model.name, cfg.data.name)
        return cls(
            model, data.train, val_data=val, test_data=test, config=cfg, run_dir=run_dir, spec=data.spec, names=names
        )

    def profile(self, top: int = 10) -> ProfileReport:
        """`fit` under torch.profiler: a trace, the top ops, and the advisor's findings (observe/profiler.py).
        Build the trainer with `log.breakdown_every=1` for every step's time split."""
        return profile_run(profile_target(self.parts, self.config, self.fit), top)

    # ----------------------------------------------------------------- the loop
    def fit(self, on_step: Callable[[], None] | None = None) -> dict[str, Any]:
        """Train to the end (epochs, max_steps or early stop); return the summary (summary.json).

        Args:
            on_step: called after each optimizer step (a profiler's step clock).
        """
        self.model.train()
        self.parts.step.model.train()
        # the feed's loader workers end with the run, however it ends
        summary = self.shell.run(lambda: self._train(on_step), closing=(self.parts.feed,))
        if self.config.train.smoke_steps is not None:  # read the checkpoint back, then keep nothing
            self.parts.console.notice(finish_smoke(self.parts, self.state, summary))
        return summary

    def validate(self, checkpoint: str | Path | None = None) -> dict[str, float]:
        """Evaluate val_data once, on the current weights or a checkpoint's, and return its metrics.

        Args:
            checkpoint: None: the model as it is; "final", "best" or "last" of the run directory, or
                a path (a checkpoint directory, a .safetensors file, or a run directory: its final
                weights), as `gputrain evaluate --checkpoint` takes; its weights stay in the model.

        Nothing is written (train/standalone.py); eval.max_batches applies.

        Raises:
            UsageError: no val_data, or weights that are not this model's.
        """
        return self._evaluate_alone("val", self.val_data, checkpoint)

    def test(self, checkpoint: str | Path | None = None) -> dict[str, float]:
        """Evaluate test_data once, as `validate` does val_data; return its metrics."""
        return self._evaluate_alone("test", self.test_data, checkpoint)

    def _evaluate_alone(
        self, split: str, data: Dataset | DataLoader | None, checkpoint: str | Path | None
    ) -> dict[str, float]:
        if data is None:
            raise UsageError(f"Trainer.{'validate' if split == 'val' else 'test'}(): the Trainer has no {split}_data")
        parts = self.parts
        if checkpoint is not None:
            loaded = load_checkpoint_weights(checkpoint, parts.run_dir, self.model, parts.place.dist)
            parts.console.info(f"{split}: evaluating {loaded}")
        metrics = parts.evaluator.evaluate(data, split).metrics
        if parts.place.dims.fsdp_enabled:
            from gputrain.distributed.fsdp import reshard

            reshard(self.model)
        shown = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        parts.console.info(f"{split}: {shown}")
        return metrics

    def _train(self, on_step: Callable[[], None] | None) -> str:
        """Epochs of steps until the run ends, then the test split. Returns how the run ended."""
        parts, state, shell = self.parts, self.state, self.shell
        timer, feed, metrics, check = parts.speed.timer, parts.feed, parts.metrics, parts.compile_check
        every_ckpt, total, device = self.config.checkpoint.every_steps, parts.total_steps, parts.place.device
        every_val = self.config.eval.every_steps if self.val_data is not None else 0
        budget, job = parts.budget, parts.place.dist
        budget.start(state)
        status = None
        while status is None:
            clock = time.perf_counter()
            timer.begin(state.global_step + 1)
            for micro_batches in feed.epoch(state.epoch, state.step_in_epoch):
                if not micro_batches:  # data.on_error=skip: no sample of this step could be read
                    self._leave_out_step()
                    continue
                if check is not None and not check.done:  # compiled: its first step against eager's
                    check.run(micro_batches[0])
                log_now = metrics.due(state.global_step + 1)
                with parts.speed.step_context():  # counts the FLOPs of the first step only
                    self._last = train_step(parts.step, micro_batches, measure_grad_norm=log_now)
                self._account(self._last, log_now)
                timer.end()
                if on_step is not None:
                    on_step()
                ends_epoch = state.step_in_epoch >= feed.steps_per_epoch or state.global_step >= total
                new_best = False
                if not ends_epoch and validation_due_mid_epoch(state.global_step, every_val):
                    # before the step's checkpoint, which then holds the early-stopping state it left
                    state.train_time_s += time.perf_counter() - clock
                    status, new_best = self._validate()
                    clock = time.perf_counter()
                    if status is not None:
                        break
                if (every_ckpt and state.global_step % every_ckpt == 0) or new_best:
                    clock = self._save_outside(clock)
                timer.begin(state.global_step + 1)
                if shell.stop_requested(log_now):
                    state.train_time_s += time.perf_counter() - clock
                    shell.interrupted()
                if state.global_step >= total:
                    break
                if budget.spent(state, job, device, log_now):
                    status = TIMED_OUT
                    break
            if device.type == "cuda":
                with own_sync():
                    torch.cuda.synchronize(device)
            state.train_time_s += time.perf_counter() - clock
            self._settle()  # before the epoch's evaluation and checkpoint
            status = self._end_epoch() if status is None else self._stop_mid_epoch(status)
        if self.test_data is not None and status != TIMED_OUT:
            self.test_metrics = self._evaluate(self.test_data, "test")
        return status

    def _validate(self) -> tuple[str | None, bool]:
        """A validation with early stopping: ("stopped_early" or None, whether it set a new best)."""
        assert self.val_data is not None
        self._settle()  # a masked step is undone before its weights are evaluated
        self.val = self._evaluate(self.val_data, "val")
        stop_early = self.parts.early_stopping.update(self.state, self.val)
        new_best = self.state.best_step == self.state.global_step
        return ("stopped_early" if stop_early else None), new_best

    def _stop_mid_epoch(self, status: str) -> str:
        """The run ends inside an epoch: early stop after a step-cadence validation, or
        train.max_time spent. Either saves a checkpoint (always, not a periodic one) and says why."""
        saved = self.shell.save()
        if status == TIMED_OUT:
            self._reason = self.parts.budget.reason(self.state, saved is not None)
            more = "; raise train.max_time to continue it" if saved is not None else ""
            self.parts.console.notice(self._reason + more)
        else:
            self._early_stop_line()
        return status

    def _early_stop_line(self) -> None:
        cfg = self.config
        self.parts.console.info(
            f"early stop: {cfg.eval.early_stop_metric} has not improved for {cfg.eval.patience} evaluations"
        )

    def _before_save(self) -> None:
        """Before a checkpoint's state is taken: the guard's pending verdicts, and the loop's time so far."""
        self._settle()
        self.parts.budget.note(self.state)

    def _leave_out_step(self) -> None:
        """A step whose every sample was unreadable (data.on_error=skip) makes no update and is not
        counted as one (the LR schedule stays with the updates); the data order moves past it, its
        samples are counted as skipped."""
        self.state.step_in_epoch += 1
        self.state.skipped_samples += self.parts.feed.take_skipped()

    def _account(self, result: StepResult, log_now: bool) -> None:
        """Count a finished step, stop or skip on a non-finite one, and log it when it is due."""
        state, parts = self.state, self.parts
        if result.verdict.kind == "nonfinite":  # the host guard's verdict, before the step is counted
            self._note_bad([BadStep(state.global_step + 1, result.verdict)])
        state.global_step += 1
        state.step_in_epoch += 1
        state.samples_seen += parts.global_batch
        state.skipped_samples += parts.feed.take_skipped()
        if log_now or parts.step.guard.due:
            self._settle()
        if log_now:
            parts.metrics.log_step(state, result)
        parts.console.advance(state.global_step)

    def _settle(self) -> None:
        """Read the device-side guard's verdicts on the steps since the last read (one sync, on a
        step that syncs anyway; nothing to read for the others): stop at the first bad step."""
        self._note_bad(self.parts.step.guard.settle(self.state.global_step))

    def _note_bad(self, bad: list[BadStep]) -> None:
        dist = self.parts.place.dist
        rank = dist.rank if dist.enabled else None
        note_bad_steps(bad, self.state, self.config.train.on_nonfinite, rank, undo=self._undo_from)

    def _undo_from(self, step: int) -> None:
        """Set the loop back to where `step` began: the device guard masked it and every later step,
        which the loop and the LR schedule had counted."""
        state, undone = self.state, self.state.global_step - (step - 1)
        state.global_step -= undone
        state.step_in_epoch -= undone
        state.samples_seen -= undone * self.parts.global_batch
        if undone:
            self.scheduler.last_epoch -= undone + 1
            self.scheduler.step()  # recomputes the LR of that position, as a step to it would

    def _end_epoch(self) -> str | None:
        """After an epoch's steps: evaluation, early stopping, the epoch's checkpoint. Returns how the
        run ends now (completed, stopped_early), or None to go on."""
        cfg, state, parts = self.config, self.state, self.parts
        if state.step_in_epoch >= parts.feed.steps_per_epoch:
            state.epoch += 1
            state.step_in_epoch = 0
        ends = state.global_step >= parts.total_steps or state.epoch >= cfg.train.epochs
        stop_early = new_best = False
        every_eval = cfg.eval.every_epochs
        epoch_due = every_eval and state.epoch % every_eval == 0
        step_due = validation_due_mid_epoch(state.global_step, cfg.eval.every_steps)
        if self.val_data is not None and (epoch_due or step_due or ends):
            stopping, new_best = self._validate()
            stop_early = stopping is not None
            new_best = new_best and step_due  # the step cadence keeps its best at once; an epoch's waits
        every_epoch_ckpt = cfg.checkpoint.every_epochs
        if ends or stop_early:
            self.shell.save()
        elif (every_epoch_ckpt and state.epoch % every_epoch_ckpt == 0) or new_best:
            self.shell.save(periodic=True)
        if stop_early:
            self._early_stop_line()
            return "stopped_early"
        if self.shell.stop_requested(True):
            self.shell.interrupted()
        return "completed" if ends else None

    def _evaluate(self, data: Dataset | DataLoader, split: str) -> dict[str, float]:
        parts = self.parts
        with self.shell.outside_steps(f"the {split} evaluation after step {self.state.global_step}"):
            result = parts.evaluator.evaluate(data, split, keep_scores=split == "test")
        if parts.place.dims.fsdp_enabled:  # its forward passes leave FSDP's root module gathered
            from gputrain.distributed.fsdp import reshard  # torch's FSDP takes ~1 s to import: only if used

            reshard(self.model)
        parts.metrics.log_eval(split, self.state, result.metrics)
        if result.scores is not None and parts.place.dist.is_main:  # what the report draws ROC curves from
            save_scores(self.run_dir / scores_name(split), result.scores)
        return result.metrics

    def _save_outside(self, clock: float) -> float:
        """Save at a step boundary, leaving the save's time out of the training time."""
        self.state.train_time_s += time.perf_counter() - clock
        self.shell.save(periodic=True)
        return time.perf_counter()

    def _figures(self, status: str) -> LoopFigures:
        """What summary.json says of this loop beyond every run's figures."""
        check = self.parts.compile_check
        return LoopFigures(
            last_loss=self._last.loss if self._last is not None else None,
            tokens_per_sample=self.parts.task.tokens_per_sample,
            val=self.val,
            test=self.test_metrics,
            eval_skipped=self.parts.evaluator.skipped,
            compile=check.status if check is not None else None,
            blocks={"reason": self._reason} if status == TIMED_OUT and self._reason else {},
        )
