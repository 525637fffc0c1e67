"""The Trainer: its parts come from build.py; `fit` is the loop.

Trainer.fit → train_step → forward_backward (step.py). The loop touches the host only on logging
steps, checkpoints and evaluations; every way a run can end leaves summary.json behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gputrain.config import Config, load_config
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import as_tensor_data
from gputrain.env.device import resolve_device
from gputrain.errors import UsageError
from gputrain.evaluate.scores import save_scores
from gputrain.observe.own_sync import own_sync
from gputrain.observe.profiler import ProfileReport, profile_run
from gputrain.precision import resolve_precision
from gputrain.run.files import run_dir_path
from gputrain.run.layout import scores_name
from gputrain.run.record import LoopFigures
from gputrain.run.shell import LoopShape, RunShell, Stateful
from gputrain.run.signals import StopRequest
from gputrain.text.for_run import tokenizer_for
from gputrain.train.build import TrainingParts, UserTPPlan, build_model_and_data, build_training, profile_target
from gputrain.train.cadence import TIMED_OUT, check_cadence, validation_due_mid_epoch
from gputrain.train.callbacks import Callbacks
from gputrain.train.ended import TrainingEnded
from gputrain.train.nonfinite import BadStep, note_bad_steps
from gputrain.train.smoke import finish_smoke
from gputrain.train.standalone import load_checkpoint_weights
from gputrain.train.state import LoopState
from gputrain.train.step import StepResult, train_step
from gputrain.train.tasks import ComputeLoss, LossFn
from gputrain.train.user_optim import OptimizerArg, SchedulerArg, check_given, config_note

if TYPE_CHECKING:
    from gputrain.text.tokenizer import Tokenizer

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


@dataclass(frozen=True, slots=True)
class _Given:
    """What the Trainer was given, kept as given until the run is built."""

    model: nn.Module | Callable[[], nn.Module]
    train_data: Dataset | DataLoader
    loss_fn: LossFn | None
    step_fn: ComputeLoss | None
    eval_fn: ComputeLoss | None
    run_dir: Path | None
    spec: DataSpec | None
    names: tuple[str, str] | None
    tp_plan: UserTPPlan | None
    optimizer: OptimizerArg | None
    scheduler: SchedulerArg | None


@dataclass(frozen=True, slots=True)
class _Built:
    parts: TrainingParts
    shell: RunShell


def _checked_config(config: ConfigLike) -> Config:
    """The config, loaded and checked (fields, values, their combinations, a device and precision this
    machine has): no process group, no file, no process switch."""
    cfg = config if isinstance(config, Config) else load_config(config)
    resolve_precision(cfg.train.precision, resolve_device(cfg.train.device)[0])
    return cfg


def _is_data(data: object) -> bool:
    """A DataLoader, a Dataset, or anything a DataLoader reads by index (a list of samples)."""
    return isinstance(data, (Dataset, DataLoader)) or (hasattr(data, "__getitem__") and hasattr(data, "__len__"))


def _check_given(
    model: object,
    train_data: object,
    val_data: object,
    test_data: object,
    functions: tuple[object, object, object],
    tp_plan: object,
) -> None:
    """What the Trainer's arguments alone can tell, told at once (one line each).

    Raises:
        UsageError: naming the argument and what it takes.
    """
    if not isinstance(model, nn.Module) and not callable(model):
        raise UsageError(
            f"model: got {type(model).__name__}; give an nn.Module, or a zero-argument function that builds one"
        )
    for name, data in (("train_data", train_data), ("val_data", val_data), ("test_data", test_data)):
        if (data is not None or name == "train_data") and not _is_data(data):
            raise UsageError(
                f"{name}: got {type(data).__name__}; give a Dataset (samples by index, with a length) or a DataLoader"
            )
    for name, function in zip(("loss_fn", "step_fn", "eval_fn"), functions, strict=True):
        if function is not None and not callable(function):
            raise UsageError(f"{name}: got {type(function).__name__}; give a function")
    if tp_plan is not None and not (isinstance(tp_plan, Mapping) or callable(tp_plan)):
        raise UsageError(
            f"tp_plan: got {type(tp_plan).__name__}; give {{module name: ParallelStyle}} or a function "
            "(module, tp degree) -> that dict"
        )


class Trainer:
    """Train any `nn.Module` on a Dataset or DataLoader with the config's practices.

    Building a Trainer is cheap: it keeps its arguments and checks what they alone can tell (the
    config's fields and values, the arguments' kinds), so a notebook can build one, look at it and
    change `trainer.config` freely. The run is built by `fit()` (or `setup()`, or reading one of the
    built attributes below): that joins the job's process group, sets the process switches, runs
    `train.batch_size=auto`'s trial steps, claims the run directory and places the model. Bad input
    found while building leaves no directory behind.

    Args:
        model: the module to train; one on the meta device (or a zero-argument function that builds
            one, called on meta) is parallelised there and each rank materialises only its own part,
            with `to_empty` and each module's `reset_parameters` (then the root's `init_steps()`
            where it has one), drawn as an eager build would have from the global generator.
        train_data: a Dataset (gputrain builds the loader from `train.batch_size`) or a DataLoader
            (its batches are the micro-batches).
        loss_fn: `loss_fn(outputs, targets)` for batches of (inputs, targets): the model's outputs
            and the batch's targets (not the whole batch); default from the task. A model returning a
            Hugging Face ModelOutput has its `.logits` read; dict batches go to `model(**batch)`,
            whose `.loss` is the loss.
        step_fn: `step_fn(model, batch) -> loss` for any other batch structure; validation and test
            then report its loss (no grad, eval mode), or `eval_fn`'s where given.
        eval_fn: `eval_fn(model, batch) -> loss` for evaluation, where it should differ from step_fn.
        val_data, test_data: validated every `eval.every_epochs` epochs and every `eval.every_steps`
            steps (train/cadence.py), and at the end, where test_data is evaluated once (not after
            a stop by `train.max_time`); `validate()` and `test()` evaluate them on their own.
        config: a Config, a dict of dotted keys, or a TOML path.
        run_dir: where the run's files go (default `runs/<model>-<data>-<time>/`).
        spec: what the data is (gputrain.data.spec.DataSpec: the task, the input shape, the number
            of classes or the vocabulary), where you know it: the task is then not told by running
            the model on the first samples. The registries' data sources give one.
        names: (model name, data name) for the default run directory's name and the report (default:
            the classes' names, lower case).
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
        callbacks: objects with any of the hooks on_fit_start(trainer), on_step_end(trainer, step,
            metrics), on_eval_end(trainer, split, metrics), on_checkpoint(trainer, path),
            on_train_end(trainer, status), on_fit_end(trainer, summary) (gputrain.Callback has them
            all, doing nothing), called on every rank in list order; `metrics` of on_step_end is the
            logged row on a logging step and None on the others, so a hook never makes the host wait
            for the device. One may stop the run (`trainer.request_stop(reason)`: stopped_early) and
            keep a state in checkpoints (`state_dict`/`load_state_dict`). gputrain.EMA and
            gputrain.StopOnMetric are two; train/callbacks.py says when each hook runs and what it may read.
        tokenizer: the tokenizer the token ids mean (gputrain.text.load_tokenizer or train_bpe): the run
            keeps it (RUN/tokenizer/, its hash in env.json), so `gputrain generate`/`evaluate`/`export`
            speak text; continuing a run kept with another is refused. `from_config` passes the data's.

    Attributes:
        config: the run's config: as given until the run is built (assignable until then), then
            with train.batch_size=auto resolved (what config.toml records).
        val_data, test_data: the evaluation splits.
        val, test_metrics: the metrics of `fit`'s last validation and of its test (summary.json).
        built: whether the run is built.
    Built attributes (reading one builds the run, as `setup()` does):
        model: the module holding this rank's parameters (the one you gave may be replaced:
            materialised from meta, sharded, converted).
        optimizer, scheduler: the run's optimizer and LR schedule.
        run_dir: where the run's files go.
        state: the loop's counters (global_step, epoch, best_step, ...), current during `fit`.
        stop: the signal handler (setting `stop.requested` stops the run as a signal would).
        parts: every part of the run (train/build.py's TrainingParts: the step, the feed, the
            evaluator, the checkpointer, the metrics logger, where the run executes, ...).

    Raises:
        UsageError (ConfigError, DataError): from the constructor, a bad config or argument; from
            `setup()`/`fit()`, input found bad while building (data, a run directory, an optimizer=
            instance whose parameters a sharded layout replaces, a factory's failure), before any step.
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
        callbacks: Iterable[Any] | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        # Only what the arguments alone can tell is checked here: nothing joins a process group,
        # runs a forward pass or a trial step, or touches the file system before `setup()`.
        self._config = _checked_config(config)
        _check_given(model, train_data, val_data, test_data, (loss_fn, step_fn, eval_fn), tp_plan)
        check_given(optimizer, scheduler, config, self._config)  # the optimizer's and the schedule's
        check_cadence(self._config, val_data is not None)
        self._callbacks = Callbacks(callbacks)
        self._tokenizer = tokenizer
        self._stop_reason: str | None = None
        """Why the run stopped before its end (summary.json's stop_reason: an early stop, train.max_time)."""
        self._ended = TrainingEnded()
        """Where the training ended, once it has: the end's checkpoint holds it (train/ended.py)."""
        self._given = _Given(
            model=model,
            train_data=train_data,
            loss_fn=loss_fn,
            step_fn=step_fn,
            eval_fn=eval_fn,
            run_dir=run_dir_path(run_dir) if run_dir is not None else None,
            spec=spec,
            names=names,
            tp_plan=tp_plan,
            optimizer=optimizer,
            scheduler=scheduler,
        )
        self.val_data, self.test_data = val_data, test_data
        self.val: dict[str, float] = {}
        self.test_metrics: dict[str, float] = {}
        """The last validation's and the test's metrics (summary.json); `test()` is the method that
        evaluates test_data on its own."""
        self._last: StepResult | None = None
        self._built: _Built | None = None

    # ----------------------------------------------------------------- building
    def setup(self) -> Trainer:
        """Build the run now (what `fit()` does first): join the job's process group, set the process
        switches, resolve `train.batch_size=auto` by trial steps, claim the run directory, place and
        parallelise the model, build the optimizer and every other part. Once only; returns self.

        Raises:
            UsageError (ConfigError, DataError): bad config or input.
        """
        if self._built is None:
            self._built = self._build()
        return self

    def _build(self) -> _Built:
        given = self._given
        try:
            return self._build_from(given)
        except AttributeError as error:  # a property's AttributeError would read as a missing attribute
            raise RuntimeError(f"building the run failed: {error}") from error

    def _build_from(self, given: _Given) -> _Built:
        val, test = as_tensor_data(self.val_data), as_tensor_data(self.test_data)
        parts = build_training(
            self._config,
            given.model,
            given.train_data,
            loss_fn=given.loss_fn,
            step_fn=given.step_fn,
            eval_fn=given.eval_fn,
            spec=given.spec,
            run_dir=given.run_dir,
            names=given.names,
            tp_plan=given.tp_plan,
            eval_splits={split: data for split, data in (("val", val), ("test", test)) if data is not None},
            user_optimizer=given.optimizer,
            user_scheduler=given.scheduler,
        )
        self.val_data, self.test_data = val, test
        task = parts.task
        shape = LoopShape(
            total=parts.total_steps,
            meta={"task": task.kind, "num_classes": task.num_classes},
            before_save=self._before_save,
            after_save=self._checkpointed,
            config_note=config_note(parts.optimizer_record) if parts.optimizer_record is not None else None,
            tokenizer=self._tokenizer,
        )
        states: dict[str, Stateful] = {"callbacks": self._callbacks, "ended": self._ended}
        return _Built(parts, RunShell(parts, parts.place.config, shape, self._figures, states=states))

    @property
    def built(self) -> bool:
        """Whether the run is built (`setup()`, `fit()`, or reading one of the built attributes)."""
        return self._built is not None

    @property
    def config(self) -> Config:
        """The run's config: as given until the run is built, then resolved (train.batch_size=auto
        decided: what config.toml records). Assignable until then (a Config, a dict of dotted keys
        or a TOML path, checked at once)."""
        return self._built.parts.place.config if self._built is not None else self._config

    @config.setter
    def config(self, value: ConfigLike) -> None:
        if self._built is not None:
            raise UsageError("Trainer.config: the run is already built; make a new Trainer for another config")
        config = _checked_config(value)
        check_given(self._given.optimizer, self._given.scheduler, value, config)
        check_cadence(config, self.val_data is not None)
        self._config = config

    @property
    def parts(self) -> TrainingParts:
        """Every part of the run (train/build.py's TrainingParts); reading it builds the run."""
        return self.setup()._run.parts

    @property
    def shell(self) -> RunShell:
        return self.setup()._run.shell

    @property
    def model(self) -> nn.Module:
        """The module holding this rank's parameters; reading it builds the run (the module you gave
        may be replaced: materialised from meta, sharded, converted)."""
        return self.parts.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.parts.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self.parts.scheduler

    @property
    def run_dir(self) -> Path:
        """Where the run's files go (the default's time stamp is taken when the run is built)."""
        return self.parts.run_dir

    @property
    def state(self) -> LoopState:
        """The loop's counters (global_step, epoch, best_step, ...), current during `fit`."""
        return self.shell.state

    @property
    def stop(self) -> StopRequest:
        """The signal handler: setting `stop.requested` stops the run as a signal would."""
        return self.shell.stop

    @property
    def _run(self) -> _Built:
        assert self._built is not None, "setup() builds the run first"
        return self._built

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
        callbacks: Iterable[Any] | None = None,
    ) -> Trainer:
        """Build model and data from the registries (what `gputrain train` does); `evaluate=False`
        leaves the validation and test splits out (a profile times training steps only); `callbacks`
        as for Trainer(...) (a sweep's trial reports to its study)."""
        cfg = config if isinstance(config, Config) and not overrides else load_config(config, overrides or ())
        if not evaluate and cfg.eval.every_steps:  # no validation split: no cadence of validations to keep
            cfg = load_config(cfg, {"eval.every_steps": 0})
        model, data = build_model_and_data(cfg, run_dir)
        val, test = (data.val, data.test) if evaluate else (None, None)
        names = (cfg.model.name, cfg.data.name)
        return cls(
            model,
            data.train,
            val_data=val,
            test_data=test,
            config=cfg,
            run_dir=run_dir,
            spec=data.spec,
            names=names,
            tokenizer=tokenizer_for(cfg, data),
            callbacks=callbacks,
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
        self.setup()
        self.model.train()
        self.parts.step.model.train()
        self._ended.mark(None, None, {}, 0)  # a resume may put back the end of an earlier fit(): not this one's
        try:
            # the feed's loader workers end with the run, however it ends
            summary = self.shell.run(lambda: self._train(on_step), closing=(self.parts.feed,))
        except Exception:
            ending = self.shell.last_ending
            self._callbacks.fit_ended(self, ending.summary if ending is not None else None, failing=True)
            raise
        if self.config.train.smoke_steps is not None:  # read the checkpoint back, then keep nothing
            self.parts.console.notice(finish_smoke(self.parts, self.state, summary))
        self._callbacks.fit_ended(self, summary, failing=False)
        return summary

    def request_stop(self, reason: str) -> None:
        """End the run early (status stopped_early, a checkpoint saved, `reason` on the console and in
        summary.json's stop_reason): after this step in one process; several ranks agree at the next
        logging step or evaluation (whichever rank asked), so that they stop at the same step."""
        self.shell.request_stop(str(reason))

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
        callbacks = self._callbacks
        callbacks.fit_started(self)
        ended = self._ended
        status = ended.at(total)  # resumed from the end's checkpoint: training and its last validation are done
        if status is not None:
            self._stop_reason, self.val = ended.reason, dict(ended.val)
        while status is None:
            clock = time.perf_counter()
            timer.begin(state.global_step + 1)
            for micro_batches in feed.epoch(state.epoch, state.step_in_epoch):
                if state.global_step >= total:  # resumed from a checkpoint of the last step: no step past it
                    break
                if not micro_batches:  # data.on_error=skip: no sample of this step could be read
                    self._leave_out_step()
                    continue
                if check is not None and not check.done:  # compiled: its first step against eager's
                    check.run(micro_batches[0])
                log_now = metrics.due(state.global_step + 1)
                with parts.speed.step_context():  # counts the FLOPs of the first step only
                    self._last = train_step(parts.step, micro_batches, measure_grad_norm=log_now)
                row = self._account(self._last, log_now)
                timer.end()
                if callbacks.step_end:  # the row read on a logging step, None on the others: no sync
                    callbacks.step_ended(self, state.global_step, row)
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
                if state.global_step >= total or self.stop.early_agreed is not None:
                    break  # a callback's stop, agreed: _end_epoch validates, saves and says why
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
        callbacks.call("on_train_end", self, status)
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
        if status != TIMED_OUT:  # the end's checkpoint: a resume from it goes on after the training
            self._ended.mark(status, self._patience_spent(), self.val, self.parts.total_steps)
        saved = self.shell.save()
        if status == TIMED_OUT:
            self._stop_reason = self.parts.budget.reason(self.state, saved is not None)
            more = "; raise train.max_time to continue it" if saved is not None else ""
            self.parts.console.notice(self._stop_reason + more)
        else:
            self._stopped_early(self._patience_spent())
        return status

    def _patience_spent(self) -> str:
        cfg = self.config.eval
        return f"{cfg.early_stop_metric} has not improved for {cfg.patience} evaluations"

    def _stopped_early(self, reason: str, at: str = "") -> None:
        self._stop_reason = reason
        self.parts.console.info(f"early stop{at}: {reason}")

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

    def _account(self, result: StepResult, log_now: bool) -> dict[str, Any] | None:
        """Count a finished step, stop or skip on a non-finite one, and log it when it is due.
        Returns the logged row (host values), None on a step that is not logged."""
        state, parts = self.state, self.parts
        if result.verdict.kind == "nonfinite":  # the host guard's verdict, before the step is counted
            self._note_bad([BadStep(state.global_step + 1, result.verdict)])
        state.global_step += 1
        state.step_in_epoch += 1
        state.samples_seen += parts.global_batch
        state.skipped_samples += parts.feed.take_skipped()
        if log_now or parts.step.guard.due:
            self._settle()
        row = parts.metrics.log_step(state, result) if log_now else None
        parts.console.advance(state.global_step)
        return row

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
        """After an epoch's steps (or the step a callback's stop was agreed at): validation (on the
        epoch or the step cadence), early stopping, the epoch's checkpoint. Returns how the run ends
        now (completed, stopped_early), or None to go on."""
        cfg, state, parts = self.config, self.state, self.parts
        if state.step_in_epoch >= parts.feed.steps_per_epoch:
            state.epoch += 1
            state.step_in_epoch = 0
        ends = state.global_step >= parts.total_steps or state.epoch >= cfg.train.epochs
        asked = self.stop.early_agreed is not None  # a callback's stop: the run's end, mid-epoch or not
        stop_early = new_best = False
        epoch_due = cfg.eval.every_epochs and state.epoch % cfg.eval.every_epochs == 0
        step_due = validation_due_mid_epoch(state.global_step, cfg.eval.every_steps)
        if self.val_data is not None and (epoch_due or step_due or ends or asked):
            stopping, new_best = self._validate()
            stop_early = stopping is not None
            new_best = new_best and step_due  # the step cadence keeps its best at once; an epoch's waits
        # a signal, and a stop a callback asked for in this evaluation, agreed by every rank together
        signal = self.shell.stop_requested(True)
        reason = self.stop.early_agreed
        if reason is None and stop_early:
            reason = self._patience_spent()
        every_epoch_ckpt = cfg.checkpoint.every_epochs
        if ends or reason is not None:
            # the end's checkpoint: a resume from it goes on after the training (train/ended.py)
            ending = "stopped_early" if reason is not None else "completed"
            self._ended.mark(ending, reason, self.val, parts.total_steps)
            self.shell.save()
        elif (every_epoch_ckpt and state.epoch % every_epoch_ckpt == 0) or new_best:
            self.shell.save(periodic=True)
        if reason is not None:
            self._stopped_early(reason, f" at step {state.global_step}" if asked else "")
            return "stopped_early"
        if signal:
            self.shell.interrupted()
        return "completed" if ends else None

    def _evaluate(self, data: Dataset | DataLoader, split: str) -> dict[str, float]:
        parts = self.parts
        with self.shell.outside_steps(f"the {split} evaluation after step {self.state.global_step}"):
            self.shell.hold(split)
            result = parts.evaluator.evaluate(data, split, keep_scores=split == "test")
        if parts.place.dims.fsdp_enabled:  # its forward passes leave FSDP's root module gathered
            from gputrain.distributed.fsdp import reshard  # torch's FSDP takes ~1 s to import: only if used

            reshard(self.model)
        parts.metrics.log_eval(split, self.state, result.metrics)
        if result.scores is not None and parts.place.dist.is_main:  # what the report draws ROC curves from
            save_scores(self.run_dir / scores_name(split), result.scores)
        self._callbacks.call("on_eval_end", self, split, result.metrics)
        return result.metrics

    def _save_outside(self, clock: float) -> float:
        """Save at a step boundary, leaving the save's time out of the training time."""
        self.state.train_time_s += time.perf_counter() - clock
        self.shell.save(periodic=True)
        return time.perf_counter()

    def _checkpointed(self, path: Path) -> None:
        self._callbacks.call("on_checkpoint", self, path)

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
            blocks={
                **({"optimizer": self.parts.optimizer_record} if self.parts.optimizer_record is not None else {}),
                **({"stop_reason": self._stop_reason} if status in ("stopped_early", TIMED_OUT) else {}),
            },
        )
