"""The Trainer: build everything from the config, then `fit` runs the loop.

fit → train_step → forward_backward (see step.py). The loop itself touches the host only on
logging steps, checkpoints and evaluations.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gputrain.checkpoint import (
    find_resumable,
    load_checkpoint,
    rotate_checkpoints,
    save_checkpoint,
)
from gputrain.checkpoint.async_save import AsyncSaver
from gputrain.checkpoint.sharded import (
    ShardedSaver,
    is_sharded_checkpoint,
    load_portable_checkpoint,
    save_final_weights,
)
from gputrain.config import Config, config_to_toml, load_config, resolve_grad_accum
from gputrain.config.validate import check_cuda_graphs, check_pipeline_precision
from gputrain.data.augment import apply_channels_last, build_batch_transform
from gputrain.data.pixels import pixel_scaler_for
from gputrain.data.spec import DataSpec
from gputrain.distributed import (
    DistContext,
    all_reduce_mean,
    init_distributed,
    parallelize,
)
from gputrain.distributed.context import agree_on_path, rank_device
from gputrain.distributed.faults import install_test_fault
from gputrain.distributed.parallelize import (
    choose_strategy,
    describe_choice,
    pp_group,
    setup_parallel,
)
from gputrain.env.device import resolve_device
from gputrain.errors import (
    ConfigError,
    GputrainError,
    Interrupted,
    RunError,
)
from gputrain.observe.console import RunConsole
from gputrain.observe.logger import setup_logging
from gputrain.observe.own_sync import own_sync
from gputrain.observe.sinks import JsonlSink, Sinks, TensorBoardSink
from gputrain.observe.speed import SpeedMeter
from gputrain.optim import build_optimizer, build_schedule
from gputrain.precision import Precision, resolve_precision
from gputrain.switches import apply_process_switches
from gputrain.train.batches import BatchPlan
from gputrain.train.evaluate import evaluate, resolve_metrics, shard_for_eval
from gputrain.train.feed import BatchFeed, eval_batches
from gputrain.train.nonfinite import NonFiniteGuard
from gputrain.train.run_files import default_run_dir, write_json, write_text
from gputrain.train.signals import StopRequest
from gputrain.train.state import LoopState, capture_rng, restore_rng, seed_everything
from gputrain.train.step import StepParts, train_step
from gputrain.train.summary import build_summary
from gputrain.train.tasks import LossFn, default_loss, infer_task, metric_mode

log = logging.getLogger("gputrain")
StepFn = Callable[[nn.Module, Any], torch.Tensor]
ConfigLike = Config | Mapping[str, Any] | str | Path | None


class Trainer:
    """Train any `nn.Module` on a Dataset or DataLoader with the config's practices.

    Args:
        model: the module to train.
        train_data: a Dataset (gputrain builds the loader from `train.batch_size`) or a DataLoader
            (its batches are the micro-batches).
        loss_fn: `loss_fn(outputs, targets)` for batches of (inputs, targets); default from the task.
        step_fn: `step_fn(model, batch) -> loss` for any other batch structure.
        val_data, test_data: evaluated every `eval.every_epochs` epochs and at the end.
        config: a Config, a dict of dotted keys, or a TOML path.
        run_dir: where the run's files go (default `runs/<model>-<data>-<time>/`).

    Raises:
        UsageError (ConfigError, DataError): bad config or input, before anything heavy starts.
    """

    def __init__(self, model: nn.Module, train_data: Dataset | DataLoader, *, loss_fn: LossFn | None = None,
                 step_fn: StepFn | None = None, val_data: Dataset | DataLoader | None = None,
                 test_data: Dataset | DataLoader | None = None, config: ConfigLike = None,
                 run_dir: str | Path | None = None, spec: DataSpec | None = None,
                 names: tuple[str, str] | None = None) -> None:
        self.config = config if isinstance(config, Config) else load_config(config)
        cfg = self.config
        self.device, device_reason = resolve_device(cfg.train.device)
        self.precision_mode, precision_reason = resolve_precision(cfg.train.precision, self.device)
        self.dist: DistContext = init_distributed(self.device, cfg.parallel.timeout_s,
                                                  cpu_collectives=cfg.parallel.cpu_offload)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = rank_device(self.dist.local_rank)  # one GPU per rank
        switches = apply_process_switches(self.device, self.precision_mode, cfg.train.deterministic)
        self.parallel_choice = choose_strategy(cfg, model, self.dist, self.device, train_data)
        cuda_graphs = cfg.train.cuda_graphs and self.device.type == "cuda"
        check_cuda_graphs(cuda_graphs, self.parallel_choice.strategy, chosen_by_auto=cfg.parallel.strategy == "auto")
        dims = setup_parallel(self.dist, self.parallel_choice, cfg, self.device)
        check_pipeline_precision(self.precision_mode, dims.pp_enabled)  # auto may have chosen fp16
        setup_logging(self.dist.rank, self.dist.world_size)
        self.grad_accum = resolve_grad_accum(cfg, self.dist.dp_size)
        self.console = RunConsole(cfg.log.progress, enabled=self.dist.is_main)
        set_by_us = switches.describe(self.device)
        self.console.info(f"device: {self.device} ({device_reason}); precision {self.precision_mode} "
                          f"({precision_reason})" + (f"; {set_by_us}" if set_by_us else ""))
        self.console.info(describe_choice(self.parallel_choice, self.dist))
        self.model = model.to(self.device)
        channels_last = apply_channels_last(self.model, self.device, sharded=dims.fsdp_enabled,
                                            pipelined=dims.pp_enabled)  # conv nets on CUDA
        self.loss_fn, self.step_fn = loss_fn, step_fn
        self.spec = spec
        self.task = spec.task if spec is not None else None
        if self.task is not None and loss_fn is None and step_fn is None:
            self.loss_fn = default_loss(self.task)
        self.num_classes = spec.num_classes if spec is not None else None
        self.val_data, self.test_data = val_data, test_data
        if self.task is not None:
            self._check_eval_metrics()
        model_name, data_name = names or (type(model).__name__.lower(), type(train_data).__name__.lower())
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir(model_name, data_name)
        self.run_dir = agree_on_path(self.run_dir, self.dist)  # rank 0's timestamp, for every rank's shards
        install_test_fault(model, self.dist.rank)  # no-op unless GPUTRAIN_TEST_FAULT is set (tests only)
        self._check_resume_path()

        if isinstance(train_data, DataLoader):
            self.plan = None
            self.global_batch = (train_data.batch_size or 1) * self.grad_accum * self.dist.dp_size
        else:
            self.plan = BatchPlan(num_samples=len(train_data), global_batch=cfg.train.batch_size,  # type: ignore[arg-type]
                                  grad_accum=self.grad_accum, dp_rank=self.dist.dp_rank, dp_size=self.dist.dp_size,
                                  seed=cfg.train.seed)
            self.global_batch = cfg.train.batch_size
            if self.plan.steps_per_epoch == 0:
                raise ConfigError("train.batch_size", f"is larger than the {len(train_data)} training samples",  # type: ignore[arg-type]
                                  cfg.train.batch_size)
        self.feed = BatchFeed(train_data, self.plan, self.device, cfg.data.num_workers, on_error=cfg.data.on_error)
        self.feed.grad_accum = self.grad_accum
        self.pixels = pixel_scaler_for(spec, train_data, self.device)  # uint8 images become floats on the device
        self.feed.transform = build_batch_transform(cfg.data.augment, channels_last, self.pixels)
        if cfg.train.cuda_graphs and self.device.type != "cuda":
            self.console.info(f"train.cuda_graphs: ignored on {self.device.type} (CUDA graphs need a CUDA device)")
        if self.feed.steps_per_epoch == 0:
            raise ConfigError("train.grad_accum", "the DataLoader has fewer batches than one accumulation",
                              self.grad_accum)
        self.total_steps = cfg.train.epochs * self.feed.steps_per_epoch
        if cfg.train.max_steps is not None:
            self.total_steps = min(self.total_steps, cfg.train.max_steps)

        self.precision = Precision(self.precision_mode, self.device)
        # parallelize before the optimizer: FSDP/TP replace the parameters, PP keeps only this rank's stage
        par = parallelize(self.model, self.dist, cfg, self.device, self.precision_mode, self.parallel_choice,
                          self.grad_accum)
        self.model, self.step_model, self.pipeline = par.model, par.step_model, par.pipeline
        if self.pipeline is not None:
            self.pipeline.loss_fn = self._pipeline_loss
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim, self.global_batch, self.device)
        self.scheduler = build_schedule(self.optimizer, cfg.optim, self.total_steps)
        self.parts = StepParts(model=self.step_model, optimizer=self.optimizer, scheduler=self.scheduler,
                               precision=self.precision, compute_loss=self._compute_loss,
                               clip_grad_norm=cfg.train.clip_grad_norm, clip_grad_value=cfg.train.clip_grad_value,
                               pipeline=self.pipeline, pp_group=pp_group(self.dist),
                               params=list(self.step_model.parameters()), persistent_grads=cuda_graphs,
                               guard=None if cfg.train.on_nonfinite == "off" else
                               NonFiniteGuard(cfg.train.on_nonfinite, distributed=self.dist.enabled,
                                              scaler_active=self.precision.scaler is not None))
        dims = self.dist.dims
        # data-parallel gradient traffic is timed apart from backward; PP runs its own backward
        self.parts.time_comm = (dims is not None and (dims.ddp_enabled or dims.fsdp_enabled)
                                and self.pipeline is None)
        self.speed = SpeedMeter(self.model, self.device, self.precision_mode, self.dist.world_size, self.global_batch,
                                spec.input_shape[0] if spec is not None and spec.task == "lm" else None,
                                cfg.log.breakdown_every, count_flops=self.pipeline is None,
                                comm_timed=self.parts.time_comm)
        if self.pipeline is not None:
            log.info("FLOPs are not counted under pipeline parallelism: MFU stays null for this run")
        self.parts.timer = self.feed.timer = self.speed.timer
        self.state = LoopState()
        self.stop = StopRequest()
        # several ranks: sharded saves (asynchronous with DCP when asked); one process: a background
        # thread when checkpoint.async_save, else plain synchronous saves
        self.saver = ShardedSaver(self.dist, cfg.checkpoint.async_save) if self.dist.enabled else AsyncSaver()

    # ----------------------------------------------------------------- building from a config
    @classmethod
    def from_config(cls, config: ConfigLike = None, run_dir: str | Path | None = None,
                    overrides: Mapping[str, Any] | list[str] = ()) -> "Trainer":
        """Build model and data from the registries (what `gputrain train` does)."""
        from gputrain.data import build_data
        from gputrain.models import build_model

        cfg = config if isinstance(config, Config) and not overrides else load_config(config, overrides)
        resolve_device(cfg.train.device)  # fail on a missing device before loading anything
        seed_everything(cfg.train.seed)
        bundle = build_data(cfg.data, cfg.train.seed)
        model = build_model(cfg.model, bundle.spec)
        return cls(model, bundle.train, val_data=bundle.val, test_data=bundle.test, config=cfg, run_dir=run_dir,
                   spec=bundle.spec, names=(cfg.model.name, cfg.data.name))

    # ----------------------------------------------------------------- the loss of one batch
    def _compute_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        if self.step_fn is not None:
            return self.step_fn(model, batch)
        if not isinstance(batch, (list, tuple)) or len(batch) < 2:
            raise RunError("batches are not (inputs, targets): pass step_fn(model, batch) -> loss to the Trainer")
        inputs, targets = batch[0], batch[1]
        outputs = model(inputs)
        if self.task is None:
            self._learn_task(outputs, targets)
        return self.loss_fn(outputs, targets)  # type: ignore[misc]

    def _pipeline_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Loss of one micro-batch on the last pipeline stage (the schedule runs the forward itself)."""
        if self.step_fn is not None:
            raise RunError("step_fn cannot be used with pipeline parallelism: pass loss_fn(outputs, targets)")
        if self.loss_fn is None:
            self._learn_task(outputs, targets)
        return self.loss_fn(outputs, targets)  # type: ignore[misc]

    def _learn_task(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """For user models: the metrics (and, without a loss_fn, the loss) from the first batch's
        shapes and dtypes; no host sync."""
        task = infer_task(outputs, targets)
        if task is None:
            if self.loss_fn is not None:
                self.task = "custom"  # train with the user's loss; evaluation reports that loss only
                return
            raise RunError(f"cannot tell the task from outputs {tuple(outputs.shape)} and targets "
                           f"{tuple(targets.shape)}: pass loss_fn= or step_fn= to the Trainer")
        self.task = task
        if self.loss_fn is None:
            self.loss_fn = default_loss(task)
        if task == "classification" and self.num_classes is None:
            self.num_classes = outputs.shape[-1]
        self._check_eval_metrics()

    # ----------------------------------------------------------------- resume
    def _check_resume_path(self) -> None:
        resume = self.config.checkpoint.resume
        if resume not in ("auto", "never") and not Path(resume).is_dir():
            raise ConfigError("checkpoint.resume", "no such checkpoint directory; use auto, never or a path like "
                              "runs/NAME/checkpoints/step-100", resume)

    def _resume_point(self) -> tuple[Path | None, bool]:
        """(checkpoint to resume from or None, whether it has been verified already)."""
        resume = self.config.checkpoint.resume
        if resume == "never":
            return None, False
        if resume == "auto":
            return find_resumable(self.run_dir / "checkpoints"), True
        return Path(resume), False

    def _load(self, path: Path, verified: bool = False) -> None:
        from gputrain.checkpoint import CorruptCheckpoint

        portable = self.dist.enabled or is_sharded_checkpoint(path)  # any format onto any layout, by name
        try:
            if portable:
                saved = load_portable_checkpoint(path, self.model, self.optimizer, verified=verified)
            else:
                saved = load_checkpoint(path, self.model, verified=verified)
        except CorruptCheckpoint as err:
            raise RunError(f"cannot resume: {err}") from None
        try:
            if not portable:
                self.optimizer.load_state_dict(saved["optimizer"])
            self.scheduler.load_state_dict(saved["scheduler"])
            self.precision.load_state_dict(saved["precision"])
            self.state = LoopState.from_dict(saved["loop"])
            restore_rng(saved["rng"][min(self.dist.rank, len(saved["rng"]) - 1)] if isinstance(saved["rng"], list)
                        else saved["rng"], self.device)
        except (KeyError, TypeError, ValueError, RuntimeError) as err:  # verified bytes, but not our state
            raise RunError(f"cannot resume: {path}: state.pt does not hold this run's training state "
                           f"({type(err).__name__}: {str(err)[:120]})") from None
        if saved.get("task"):
            self.task, self.num_classes = saved["task"], saved.get("num_classes")
            if self.loss_fn is None and self.step_fn is None:
                self.loss_fn = default_loss(self.task)

    def _save(self) -> Path | None:
        if not self.config.checkpoint.enabled or not (self.dist.is_main or self.dist.enabled):
            return None
        state = {"scheduler": self.scheduler.state_dict(),
                 "precision": self.precision.state_dict(), "loop": self.state.to_dict(), "rng": capture_rng(self.device),
                 "task": self.task, "num_classes": self.num_classes}
        root = self.run_dir / "checkpoints"
        keep = {self.state.best_step} if self.config.checkpoint.keep_best and self.state.best_step else set()
        if self.dist.enabled:  # every rank writes its shards; rank 0 commits and rotates
            return self.saver.save(root, self.state.global_step, self.model, self.optimizer, state,
                                   on_commit=lambda: rotate_checkpoints(root, self.config.checkpoint.keep_last, keep))
        state["optimizer"] = self.optimizer.state_dict()
        state["param_names"] = [name for name, _ in self.model.named_parameters()]  # lets a multi-rank job resume it
        if self.config.checkpoint.async_save:  # rotation runs once the background save has committed
            return self.saver.save(root, self.state.global_step, self.model, state,
                                   after=lambda _: rotate_checkpoints(root, self.config.checkpoint.keep_last, keep))
        path = save_checkpoint(root, self.state.global_step, self.model, state)
        rotate_checkpoints(root, self.config.checkpoint.keep_last, keep)
        return path

    # ----------------------------------------------------------------- evaluation
    def _evaluate(self, data: Dataset | DataLoader, split: str) -> dict[str, float]:
        if self.task is None:
            return {}
        names = resolve_metrics(self.config.eval.metrics, self.task)
        batch = max(1, self.global_batch // self.grad_accum)
        model, shared = self.step_model, False
        if self._replicated() and not isinstance(data, DataLoader) and len(data) >= self.dist.world_size:  # type: ignore[arg-type]
            # every rank holds the whole model: each evaluates its share of the split with the plain
            # module (no collective in its forward), and the sums are combined at the end. A rank
            # with no sample would skip the metrics' state gathering its peers wait in.
            data, model, shared = shard_for_eval(data, self.dist.rank, self.dist.world_size), self.model, True
            batch = max(1, batch // self.dist.world_size)
        batches = eval_batches(data, batch, self.device)
        if self.pixels is not None:
            batches = map(self.pixels, batches)
        return evaluate(model, batches, task=self.task, metric_names=names,
                        loss_fn=self.loss_fn, num_classes=self.num_classes, device=self.device,
                        autocast=self.precision.autocast, step_fn=self.step_fn, across_ranks=shared)

    def _replicated(self) -> bool:
        """Plain DDP: every rank has the full model, so evaluation can be split between them.
        Sharded layouts (FSDP, TP, PP) need every rank in every forward pass and evaluate whole."""
        dims = self.dist.dims
        return bool(self.dist.enabled and dims is not None and dims.ddp_enabled
                    and dims.dp_replicate == self.dist.world_size and self.pipeline is None)

    def _check_eval_metrics(self) -> None:
        """Unknown metric names fail before training starts, not after its first epoch."""
        names = resolve_metrics(self.config.eval.metrics, self.task)  # type: ignore[arg-type]
        monitored = self.config.eval.early_stop_metric
        if monitored is not None and monitored not in names:
            raise ConfigError("eval.early_stop_metric", "is not among the validation metrics: " + ", ".join(names),
                              monitored)

    def _early_stop_check(self, metrics: dict[str, float]) -> bool:
        """Track the best monitored value; True when patience has run out."""
        monitored = self.config.eval.early_stop_metric or ("loss" if "loss" in metrics else None)
        if monitored is None or monitored not in metrics:
            if self.config.eval.early_stop_metric:
                raise ConfigError("eval.early_stop_metric", "is not among the validation metrics: "
                                  + ", ".join(metrics), monitored)
            return False
        value = metrics[monitored]
        better = metric_mode(monitored, self.config.eval.mode) == "min"
        best = self.state.best_metric
        if best is None or (value < best if better else value > best):
            self.state.best_metric, self.state.best_step = value, self.state.global_step
            self.state.evals_without_improvement = 0
            return False
        self.state.evals_without_improvement += 1
        return (self.config.eval.early_stop_metric is not None
                and self.state.evals_without_improvement >= self.config.eval.patience)

    # ----------------------------------------------------------------- fit
    def fit(self) -> dict[str, Any]:
        """Train to the end (epochs, max_steps or early stop); return the summary (summary.json)."""
        started = time.perf_counter()
        resume_from, verified = self._resume_point()
        if resume_from is not None:
            self._load(resume_from, verified)
            self.console.info(f"resumed from {resume_from} (step {self.state.global_step})")
        sinks = self._open_run_dir(resume_from is not None)
        status = "completed"
        error: str | None = None
        try:
            try:
                status = self._loop(sinks)
            except KeyboardInterrupt:
                raise  # a second signal leaves at once; an unfinished background save is never at a final path
            except BaseException:
                self.saver.wait()  # keep the last good checkpoint the failed run was writing
                raise
            self.saver.wait()  # no checkpoint write outlives the loop
        except Interrupted:
            raise
        except GputrainError:
            raise
        except Exception as exc:  # a crash inside the user's model or data: keep the evidence
            error = f"step {self.state.global_step + 1}" + (f" (rank {self.dist.rank})" if self.dist.enabled
                                                              else "") + f": {type(exc).__name__}: {exc}"
            self.run_dir.mkdir(parents=True, exist_ok=True)
            log_name = "error.log" if self.dist.is_main else f"error-rank{self.dist.rank}.log"
            write_text(self.run_dir / log_name, traceback.format_exc())
            status = "failed"
        finally:
            self.console.stop()
            self.stop.uninstall()
        test = {}
        if status != "failed" and self.test_data is not None:
            test = self._evaluate(self.test_data, "test")
            self._log_eval(sinks, "test", test)
        sinks.close()
        summary = build_summary(self, status, time.perf_counter() - started, test)
        if status != "failed":  # collective when the weights are sharded; rank 0 writes
            self.saver.wait()
            save_final_weights(self.run_dir / "model.safetensors", self.model, self.dist, self.pipeline is not None)
        if self.dist.is_main:
            write_json(self.run_dir / "summary.json", summary)
            self.console.final_table(summary, str(self.run_dir))
        if error is not None:
            raise RunError(f"training failed at {error} (traceback in {self.run_dir / log_name})")
        return summary

    def _open_run_dir(self, resumed: bool) -> Sinks:
        if not self.dist.is_main:
            return Sinks([])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_text(self.run_dir / "config.toml", config_to_toml(self.config))
        from gputrain.env import collect_env

        write_json(self.run_dir / "env.json", collect_env().to_dict())
        resume_step = self.state.global_step if resumed else None
        sinks: list[Any] = [JsonlSink(self.run_dir / "metrics.jsonl", resume_step)]
        if self.config.log.tensorboard:
            sinks.append(TensorBoardSink(self.run_dir / "tensorboard", resume_step))
        return Sinks(sinks)

    def _log_eval(self, sinks: Sinks, split: str, metrics: dict[str, float]) -> None:
        if metrics:
            sinks.write({"step": self.state.global_step, "epoch": self.state.epoch, "split": split, **metrics})
            self.console.evaluated(split, max(0, self.state.epoch - 1) if split == "val" else None, metrics)

    def _loop(self, sinks: Sinks) -> str:
        cfg, state = self.config, self.state
        every_log, every_ckpt = cfg.log.every_steps, cfg.checkpoint.every_steps
        self.stop.install()
        self.console.start(self.total_steps, state.global_step)
        self.model.train()
        last_log_time, last_log_samples = time.perf_counter(), state.samples_seen
        last_log_step = state.global_step
        self.last_loss: torch.Tensor | None = None
        timer = self.speed.timer
        while state.epoch < cfg.train.epochs and state.global_step < self.total_steps:
            epoch_start = time.perf_counter()
            timer.begin(state.global_step + 1)
            for micro_batches in self.feed.epoch(state.epoch, state.step_in_epoch):
                log_now = (state.global_step + 1) % every_log == 0 or state.global_step + 1 == self.total_steps
                with self.speed.step_context():  # counts the FLOPs of the first step only
                    loss, grad_norm = train_step(self.parts, micro_batches, measure_grad_norm=log_now)
                if self.parts.guard is not None and self.parts.guard.last == "nonfinite":
                    if self.config.train.on_nonfinite == "stop":
                        raise self.parts.guard.error(state.global_step + 1, self.dist.rank if self.dist.enabled else None)
                    state.nonfinite_steps += 1
                    log.warning("step %d: %s; step skipped (%d so far)", state.global_step + 1,
                                self.parts.guard.last_reason, state.nonfinite_steps)
                state.global_step += 1
                state.step_in_epoch += 1
                state.skipped_samples, self.feed.skipped_samples = state.skipped_samples + self.feed.skipped_samples, 0
                state.samples_seen += self.global_batch
                self.last_loss = loss
                if log_now:  # the loss and grad norm reach the host only here (the non-finite guard syncs one flag)
                    now = time.perf_counter()
                    with own_sync():
                        record = self._step_record(loss, grad_norm, (state.samples_seen - last_log_samples)
                                                   / max(now - last_log_time, 1e-9))
                        record.update(self.speed.record_fields(state.global_step - last_log_step,
                                                               now - last_log_time))
                    sinks.write(record)
                    self.console.logged(record, self.total_steps)
                    last_log_time, last_log_samples = time.perf_counter(), state.samples_seen
                    last_log_step = state.global_step
                self.console.advance(state.global_step)
                timer.end()
                if every_ckpt and state.global_step % every_ckpt == 0:
                    state.train_time_s += time.perf_counter() - epoch_start
                    self._save()
                    epoch_start = time.perf_counter()
                timer.begin(state.global_step + 1)
                if self._stop_agreed(log_now):
                    state.train_time_s += time.perf_counter() - epoch_start
                    return self._interrupted()
                if state.global_step >= self.total_steps:
                    break
            if self.device.type == "cuda":
                with own_sync():
                    torch.cuda.synchronize(self.device)
            state.train_time_s += time.perf_counter() - epoch_start
            if state.step_in_epoch >= self.feed.steps_per_epoch:
                state.epoch += 1
                state.step_in_epoch = 0
            stop_early = False
            ends = state.global_step >= self.total_steps or state.epoch >= cfg.train.epochs
            every_eval = cfg.eval.every_epochs
            if self.val_data is not None and ((every_eval and state.epoch % every_eval == 0) or ends):
                metrics = self._evaluate(self.val_data, "val")
                self.val_metrics = metrics
                self._log_eval(sinks, "val", metrics)
                stop_early = self._early_stop_check(metrics)
            every_epoch_ckpt = cfg.checkpoint.every_epochs
            if (every_epoch_ckpt and state.epoch % every_epoch_ckpt == 0) or ends or stop_early:
                self._save()
            if stop_early:
                self.console.info(f"early stop: {cfg.eval.early_stop_metric} has not improved for "
                                  f"{cfg.eval.patience} evaluations")
                return "stopped_early"
            if self._stop_agreed(True):
                return self._interrupted()
        return "completed"

    def _stop_agreed(self, sync_point: bool) -> bool:
        """Whether to stop for a signal now. One process stops as soon as one came. Several ranks
        agree first, on logging steps (which sync anyway): a signal reaches each rank at a slightly
        different moment, and a rank that stopped alone would leave its peers waiting in the next
        collective, where all ranks save the same step together."""
        if not self.dist.enabled:
            return self.stop.requested is not None
        if not sync_point:
            return False
        flag = torch.tensor([0 if self.stop.requested is None else 1], device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        with own_sync():
            stop = bool(flag.item())
        if stop and self.stop.requested is None:
            self.stop.requested = "a signal to another rank"
        return stop

    def _step_record(self, loss: torch.Tensor, grad_norm: torch.Tensor | None, samples_per_s: float) -> dict[str, Any]:
        loss_value = all_reduce_mean(loss.float(), self.dist).item()
        self.last_loss = torch.tensor(loss_value)  # the summary reports the global mean, not rank 0's share
        record: dict[str, Any] = {
            "step": self.state.global_step, "epoch": self.state.epoch, "loss": loss_value,
            "lr": self.optimizer.param_groups[0]["lr"],
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "samples_per_s": samples_per_s,
        }
        if self.task == "lm" and self.spec is not None:
            record["tokens_per_s"] = samples_per_s * self.spec.input_shape[0]
        if not math.isfinite(loss_value):
            log.warning("step %d: loss is %s", self.state.global_step, loss_value)
        return record

    def _interrupted(self) -> str:
        path = self._save()
        self.saver.wait()
        where = f"checkpoint saved at {path}; " if path else ""
        raise Interrupted(f"stopped by {self.stop.requested} at step {self.state.global_step}; {where}"
                          f"run again with --run-dir {self.run_dir} to resume")


__all__ = ["Trainer"]
