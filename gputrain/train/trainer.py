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
from gputrain.evaluate.scores import save_scores
from gputrain.observe.own_sync import own_sync
from gputrain.observe.profiler import ProfileReport, profile_run
from gputrain.run.layout import scores_name
from gputrain.run.record import LoopFigures
from gputrain.run.shell import LoopShape, RunShell
from gputrain.train.build import UserTPPlan, build_model_and_data, build_training, profile_target
from gputrain.train.nonfinite import BadStep, note_bad_steps
from gputrain.train.step import StepResult, train_step
from gputrain.train.tasks import ComputeLoss, LossFn
from gputrain.train.user_optim import OptimizerArg, SchedulerArg, check_given, config_note

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
        val_data, test_data: evaluated every `eval.every_epochs` epochs and at the end.
        config: a Config, a dict of dotted keys, or a TOML path.
        run_dir: where the run's files go (default `runs/<model>-<data>-<time>/`).
        tp_plan: for `parallel.strategy=tp` with a model of your own: {module name: ColwiseParallel(),
            ...} (torch.distributed.tensor.parallel), or a function (module, tp degree) -> that dict.
        optimizer: your own optimizer instead of the config's `optim.*` one: a `torch.optim.Optimizer`
            instance (its parameter groups kept as they are), or a factory called with the
            parameters as the step trains them, e.g. `functools.partial(torch.optim.AdamW, lr=1e-3)`.
            FSDP, TP, pipeline stages, fp8 and a meta-device model replace the parameters: there an
            instance is refused (UsageError) and a factory is what works. The factory gets a
            `TrainParams` (gputrain.optim.params): a plain list of the trainable parameters with
            `.names` (yours, without `_orig_mod.`-style wrapper segments), `.named()` and `.module`,
            for parameter groups; `weight_decay_groups(params, wd)` makes the decay / no-decay pair.
            It must hold every trainable parameter (set `requires_grad=False` on what it should not
            train: a parameter left out would pile up gradients that nothing zeroes).
            Any class works (the fused/foreach path is the class's own: `fused=True` is yours to
            pass); train.on_nonfinite guards it on the device where it is torch's fused Adam, AdamW,
            SGD or Adagrad, else on the host. Its state is checkpointed and resumed with the run.
        scheduler: your own LR scheduler instead of the config's schedule: an `LRScheduler` over
            the optimizer in use (only with an `optimizer=` instance), or a factory `optimizer ->
            LRScheduler` (e.g. `lambda opt: OneCycleLR(opt, max_lr=1e-2, total_steps=1000)`). Stepped
            once per applied optimizer step (a step the non-finite guard skips does not move it) and
            checkpointed. Without `scheduler=` the config's schedule runs over your optimizer (each
            group's LR is its peak). The config may not set an `optim.*` field that `optimizer=` or
            `scheduler=` replaces (a dict or TOML naming it, or a Config whose value differs from the
            default): one UsageError names them. `gputrain lr-find` and `gputrain plan` read the
            config's optimizer only; summary.json's "optimizer" block records a user's (its class,
            parameter groups, kernel path, where the non-finite guard decides).

    Attributes:
        config: the run's config, with train.batch_size=auto resolved (what config.toml records).
        model: the module holding this rank's parameters.
        optimizer, scheduler: the run's optimizer and LR schedule.
        run_dir: where the run's files go.
        state: the loop's counters (global_step, epoch, best_step, ...), current during `fit`.
        stop: the signal handler (setting `stop.requested` stops the run as a signal would).
        parts: every part of the run, built (train/build.py's TrainingParts: the step, the feed, the
            evaluator, the checkpointer, the metrics logger, where the run executes, ...).

    Raises:
        UsageError (ConfigError, DataError): bad config or input, before anything heavy starts
            (an optimizer= instance a sharded layout replaces the parameters of, before the run
            directory is claimed; a factory's failure once the model is parallelised).
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
        optimizer: OptimizerArg | None = None,
        scheduler: SchedulerArg | None = None,
    ) -> None:
        cfg = config if isinstance(config, Config) else load_config(config)
        check_given(optimizer, scheduler, config, cfg)  # what the arguments alone tell
        self.parts = parts = build_training(
            cfg,
            model,
            train_data,
            loss_fn=loss_fn,
            step_fn=step_fn,
            eval_fn=eval_fn,
            spec=spec,
            run_dir=run_dir,
            names=names,
            tp_plan=tp_plan,
            user_optimizer=optimizer,
            user_scheduler=scheduler,
        )
        self.config = parts.place.config
        self.model, self.optimizer, self.scheduler, self.run_dir = (
            parts.model,
            parts.optimizer,
            parts.scheduler,
            parts.run_dir,
        )
        self.val_data, self.test_data = as_tensor_data(val_data), as_tensor_data(test_data)
        for split, data in (("val", self.val_data), ("test", self.test_data)):
            if data is not None:  # a split its evaluation cannot take fails now, not after an epoch
                parts.evaluator.check(data, split)
        self.val: dict[str, float] = {}
        self.test: dict[str, float] = {}
        """The last validation's and the test's metrics (summary.json)."""
        self._last: StepResult | None = None
        task = parts.task
        shape = LoopShape(
            total=parts.total_steps,
            meta={"task": task.kind, "num_classes": task.num_classes},
            before_save=self._settle,
            config_note=config_note(parts.optimizer_record) if parts.optimizer_record is not None else None,
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
        return self.shell.run(lambda: self._train(on_step), closing=(self.parts.feed,))

    def _train(self, on_step: Callable[[], None] | None) -> str:
        """Epochs of steps until the run ends, then the test split. Returns how the run ended."""
        parts, state, shell = self.parts, self.state, self.shell
        timer, feed, metrics, check = parts.speed.timer, parts.feed, parts.metrics, parts.compile_check
        every_ckpt, total, device = self.config.checkpoint.every_steps, parts.total_steps, parts.place.device
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
                if every_ckpt and state.global_step % every_ckpt == 0:
                    clock = self._save_outside(clock)
                timer.begin(state.global_step + 1)
                if shell.stop_requested(log_now):
                    state.train_time_s += time.perf_counter() - clock
                    shell.interrupted()
                if state.global_step >= total:
                    break
            if device.type == "cuda":
                with own_sync():
                    torch.cuda.synchronize(device)
            state.train_time_s += time.perf_counter() - clock
            self._settle()  # before the epoch's evaluation and checkpoint
            status = self._end_epoch()
        if self.test_data is not None:
            self.test = self._evaluate(self.test_data, "test")
        return status

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
        stop_early = False
        every_eval = cfg.eval.every_epochs
        if self.val_data is not None and ((every_eval and state.epoch % every_eval == 0) or ends):
            self.val = self._evaluate(self.val_data, "val")
            stop_early = parts.early_stopping.update(state, self.val)
        every_epoch_ckpt = cfg.checkpoint.every_epochs
        if ends or stop_early:
            self.shell.save()
        elif every_epoch_ckpt and state.epoch % every_epoch_ckpt == 0:
            self.shell.save(periodic=True)
        if stop_early:
            parts.console.info(
                f"early stop: {cfg.eval.early_stop_metric} has not improved for {cfg.eval.patience} evaluations"
            )
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
            test=self.test,
            eval_skipped=self.parts.evaluator.skipped,
            compile=check.status if check is not None else None,
            blocks={"optimizer": self.parts.optimizer_record} if self.parts.optimizer_record is not None else {},
        )
