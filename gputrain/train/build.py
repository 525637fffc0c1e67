"""Turn a config, a model and data into the parts a training loop runs with, each complete when
built: nothing is wired onto a part afterwards.

`place_run` decides where and how the run executes (device, precision, ranks, layout); then
`build_training` builds, in order, the task, the data feed, the parallelised model, the optimizer
and schedule, the step's parts, the evaluator, the checkpointer and the metrics logger. The
Trainer's loop and any other loop (evaluation, the LR finder, RL) build from the same functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from gputrain.config import Config, resolve_grad_accum
from gputrain.config.sizes import check_training_state_fits, state_memory
from gputrain.config.validate import check_cuda_graphs, check_pipeline_precision
from gputrain.data.augment import apply_channels_last, build_batch_transform
from gputrain.data.batches import BatchPlan
from gputrain.data.feed import BatchFeed
from gputrain.data.pixels import as_model_sees_it, pixel_scaler_for
from gputrain.data.spec import DataSpec, example_input
from gputrain.data.tensors import as_tensor_data
from gputrain.distributed.allocator import apply_allocator, host_shards
from gputrain.distributed.auto import StrategyChoice, choose_strategy
from gputrain.distributed.context import DistContext, agree_on_path, init_distributed, rank_device
from gputrain.distributed.faults import install_test_fault
from gputrain.distributed.parallel_dims import ParallelDims
from gputrain.distributed.parallelize import TPPlan, describe_choice, parallelize, pp_group, setup_parallel
from gputrain.env.device import resolve_device
from gputrain.env.threads import apply_threads, local_ranks
from gputrain.errors import ConfigError
from gputrain.evaluate.evaluator import EarlyStopping, EvalSpec, Evaluator, evaluation_plan
from gputrain.evaluate.layout import REPLICATED, eval_layout
from gputrain.evaluate.shares import dp_group
from gputrain.fp8 import Fp8Plan, apply_fp8, plan_fp8
from gputrain.models.meta import MetaInit, build_on_meta, is_meta, prepare_meta_init
from gputrain.models.plans import tp_plan_for
from gputrain.observe.console import RunConsole
from gputrain.observe.logger import setup_logging
from gputrain.observe.profiler import ProfileTarget
from gputrain.observe.speed import SpeedMeter
from gputrain.optim import build_optimizer, build_schedule
from gputrain.optim.states import optimizer_states_per_param
from gputrain.plan.batch import resolve_auto_batch
from gputrain.precision import Precision, resolve_precision
from gputrain.run.files import check_run_dir, default_run_dir, left_as_found, run_dir_path
from gputrain.run.prior import claim_run_dir
from gputrain.switches import apply_process_switches
from gputrain.train.cadence import TimeBudget
from gputrain.train.checkpointer import Checkpointer, check_resume_setting
from gputrain.train.compile_check import CompileCheck
from gputrain.train.device_guard import DeviceGuard
from gputrain.train.guard import build_guard
from gputrain.train.metrics import MetricsLogger
from gputrain.train.smoke import smoke_config, smoke_dir
from gputrain.train.state import seed_everything
from gputrain.train.step import StepParts
from gputrain.train.tasks import ComputeLoss, LossFn, Task, loss_of_batch, resolve_task
from gputrain.train.token_loss import PipelineTokenLoss, TokenNorm
from gputrain.train.user_optim import (
    OptimizerArg,
    SchedulerArg,
    check_instance_early,
    describe,
    describe_line,
    make_optimizer,
    make_scheduler,
    states_per_param,
)

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from gputrain.data import DataBundle

UserTPPlan = Union["Mapping[str, ParallelStyle]", TPPlan]
log = logging.getLogger("gputrain")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where and how a run executes."""

    config: Config
    """The run's config with train.batch_size / micro_batch_size = auto resolved: what config.toml records."""
    device: torch.device
    precision: str
    """train.precision resolved: fp32, tf32, bf16, fp16 or fp8."""
    dist: DistContext
    dims: ParallelDims
    choice: StrategyChoice
    grad_accum: int
    """Micro-batches per optimizer step on each rank."""
    lines: tuple[str, ...]
    """What the console says about it first: the device line, the layout line."""
    allocator: str | None = None
    """The C allocator setting in force in this process (distributed/allocator.py), described."""
    fp8: Fp8Plan | None = None
    """precision=fp8: which Linear layers go to float8 and why the others stay in bf16 (fp8.py)."""

    def start_facts(self) -> dict[str, Any]:
        """What the run resolved at its start (config.toml keeps `auto`): device, precision, world
        size and layout, env.json's "run" (run/files.py). summary.json has them only once the run
        ends; a report of a run still going reads them there."""
        world = self.dist.world_size
        layout = f"{self.choice.strategy} on {world} ranks ({self.dims.describe()})" if world > 1 else "one process"
        return {
            "device": str(self.device),
            "precision": self.precision,
            "world_size": world,
            "layout": layout,
            "allocator": self.allocator,
            **({"fp8": self.fp8.to_dict()} if self.fp8 is not None else {}),
        }


def place_run(
    config: Config, model: nn.Module, train_data: Any, precision_choice: tuple[str, str] | None = None
) -> Placement:
    """Choose the device and precision, join the job, set the process-wide switches, resolve
    train.batch_size=auto and lay out the ranks. Raises ConfigError for a device, precision, batch or
    layout that cannot work. `config` is left as it is: the resolved one is `Placement.config`.

    `precision_choice`: (precision, reason) decided by the caller instead of train.precision (the RL
    loop trains in fp32 where train.precision is auto: autocast does not pay on its small networks)."""
    cfg = config
    device, device_reason = resolve_device(cfg.train.device)
    precision, precision_reason = precision_choice or resolve_precision(cfg.train.precision, device)
    dist = init_distributed(device, cfg.parallel.timeout_s, cpu_collectives=cfg.parallel.cpu_offload)
    if dist.enabled and device.type == "cuda":
        device = rank_device(dist.local_rank)  # one GPU per rank
    switches = apply_process_switches(device, precision, cfg.train.deterministic)
    threads = apply_threads(cfg.train.num_threads, device, cfg.train.deterministic, local_ranks(dist.world_size))
    if "auto" in (cfg.train.batch_size, cfg.train.micro_batch_size):  # its trial steps run as the run will
        loss_of = _task_loss(model, train_data)
        cfg = resolve_auto_batch(cfg, model, train_data, dist.world_size, device, precision, loss_of)
        if device.type == "cuda":  # the trials probed up to what ran out: the run reports its own peak
            torch.cuda.reset_peak_memory_stats(device)
    sample = as_model_sees_it(example_input(train_data)) if cfg.parallel.strategy == "auto" else None
    choice = choose_strategy(cfg, model, dist.world_size, device, sample)
    check_cuda_graphs(
        cfg.train.cuda_graphs and device.type == "cuda", choice.strategy, chosen_by_auto=cfg.parallel.strategy == "auto"
    )
    dist, dims = setup_parallel(dist, choice, cfg, device)
    # the strategy is resolved and nothing is materialised or gathered yet: a job that shards on the
    # CPU side returns its freed shards to the OS from here on (distributed/allocator.py)
    allocator = apply_allocator(shards=host_shards(dims.fsdp_enabled, device.type, cfg.parallel.cpu_offload))
    check_pipeline_precision(precision, dims.pp_enabled)  # auto may have chosen fp16
    setup_logging(dist.rank, dist.world_size)
    set_by_us = switches.describe(device)
    device_line = (
        f"device: {device} ({device_reason}); precision {precision} ({precision_reason})"
        + (f"; {set_by_us}" if set_by_us else "")
        + f"; {threads.describe()}"
    )
    return Placement(
        config=cfg,
        device=device,
        precision=precision,
        dist=dist,
        dims=dims,
        choice=choice,
        grad_accum=resolve_grad_accum(cfg, dist.dp_size),
        lines=(device_line, describe_choice(choice, dist)),
        allocator=allocator.describe(),
        fp8=plan_fp8(model, cfg.train.fp8_recipe) if precision == "fp8" else None,  # shapes only: nothing changes
    )


def _task_loss(model: nn.Module, train_data: Any) -> ComputeLoss | None:
    """The step's loss where the data tells the task (what train.batch_size=auto measures); None
    where it cannot be told (the plan's surrogate, with cross-entropy's memory, is close)."""
    try:
        return loss_of_batch(resolve_task(model, train_data, spec=None, loss_fn=None, step_fn=None), None)
    except Exception:  # noqa: BLE001 - any failure to tell the task leaves the surrogate
        return None


@dataclass(slots=True)
class TrainingParts:
    """Everything a training loop needs, built."""

    place: Placement
    task: Task
    model: nn.Module
    """The module holding this rank's parameters (state dicts, the final weights)."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    step: StepParts
    feed: BatchFeed
    global_batch: int
    """Samples per optimizer step over all ranks and micro-batches."""
    total_steps: int
    speed: SpeedMeter
    evaluator: Evaluator
    early_stopping: EarlyStopping
    checkpointer: Checkpointer
    metrics: MetricsLogger
    console: RunConsole
    run_dir: Path
    compile_check: CompileCheck | None = None
    """The compiled model's first step against eager (compile_check.py); None: not compiled."""
    optimizer_record: dict[str, Any] | None = None
    """summary.json's "optimizer" block where the optimizer or the scheduler is the user's
    (train/user_optim.py's `describe`); None: both are the config's."""
    budget: TimeBudget = field(default_factory=lambda: TimeBudget(None))
    """train.max_time (cadence.py): the loop's time over every invocation, and whether it is spent."""


def build_training(
    config: Config,
    model: nn.Module | Callable[[], nn.Module],
    train_data: Dataset | DataLoader,
    *,
    loss_fn: LossFn | None = None,
    step_fn: ComputeLoss | None = None,
    eval_fn: ComputeLoss | None = None,
    spec: DataSpec | None = None,
    run_dir: str | Path | None = None,
    names: tuple[str, str] | None = None,
    tp_plan: UserTPPlan | None = None,
    eval_splits: Mapping[str, Dataset | DataLoader] | None = None,
    user_optimizer: OptimizerArg | None = None,
    user_scheduler: SchedulerArg | None = None,
) -> TrainingParts:
    """All the parts of a training run of `model` on `train_data` under `config`; `eval_splits`
    ({"val": data, ...}) are checked against the evaluation now (their first samples evaluated), so a
    split it cannot take fails here rather than after an epoch.

    `model` may be on the meta device (or a zero-argument function, called on meta): it is then
    parallelised there and only this rank's part materialised on the device (models/meta.py).
    `user_optimizer`, `user_scheduler`: the Trainer's optimizer= and scheduler= (train/user_optim.py),
    made once the model is parallelised; None: the config's.

    Raises:
        UsageError (ConfigError, DataError): bad config or input, before anything heavy starts.
    """
    cfg = smoke_config(config) if config.train.smoke_steps is not None else config
    model, meta_init = _on_meta(model)
    train_data = as_tensor_data(train_data)  # a TensorDataset takes the in-memory path
    check_resume_setting(cfg.checkpoint)
    place = place_run(cfg, model, train_data)
    cfg, device, dist, dims = place.config, place.device, place.dist, place.dims
    check_instance_early(user_optimizer, dims, on_meta=meta_init is not None)
    console = RunConsole(cfg.log.progress, enabled=dist.is_main, run_dir_kept=cfg.train.smoke_steps is None)
    for line in place.lines:
        console.info(line)
    task = resolve_task(model, train_data, spec=spec, loss_fn=loss_fn, step_fn=step_fn)
    metric_names, early_stopping = evaluation_plan(cfg.eval, task.kind, eval_fn, step_fn)
    model_name, data_name = names or (type(model).__name__.lower(), type(train_data).__name__.lower())
    given = run_dir_path(run_dir) if run_dir is not None else None
    if cfg.train.smoke_steps is not None:  # a directory of its own, removed at the end (train/smoke.py)
        given = smoke_dir() if dist.is_main else Path()
    run_path = agree_on_path(given or default_run_dir(model_name, data_name), dist)
    install_test_fault(model, dist.rank)  # no-op unless GPUTRAIN_TEST_FAULT is set (tests only)

    plan, global_batch = _batch_plan(cfg, train_data, place)
    with left_as_found(run_path):  # bad input found from here on leaves no directory behind
        claim_run_dir(run_path, cfg)  # the last check before anything heavy: the directory, and a run it holds
        shards = dims.dp_shard * dims.tp * dims.pp  # what holds 1/N of the weights and their state
        if user_optimizer is None:
            states: int | None = optimizer_states_per_param(cfg.optim.name, cfg.optim.momentum)
        else:  # a factory's optimizer exists only once the model is parallelised: its state is not known here
            states = states_per_param(user_optimizer)
            if states is None:
                console.info("the check that the optimizer state fits is skipped: optimizer= is a factory")
        if states is not None:
            own_name = type(user_optimizer).__name__ if user_optimizer is not None else None
            memory = state_memory(device, cfg.parallel.cpu_offload)
            check_training_state_fits(cfg, model, states, shards, *memory, optimizer_name=own_name)
        if meta_init is None:
            model = model.to(device)  # else materialised, this rank's part only, once parallelised
        channels_last = apply_channels_last(model, device, sharded=dims.fsdp_enabled, pipelined=dims.pp_enabled)
        # data-parallel gradient traffic is timed apart from backward; a pipeline runs its own backward
        time_comm = (dims.ddp_enabled or dims.fsdp_enabled) and not dims.pp_enabled
        speed = SpeedMeter(
            model,
            device,
            place.precision,
            dist.world_size,
            global_batch,
            task.tokens_per_sample,
            cfg.log.breakdown_every,
            count_flops=not dims.pp_enabled,
            comm_timed=time_comm,
            rank=dist.rank,
        )
        pixels = pixel_scaler_for(spec, train_data, device)  # uint8 images become floats on the device
        feed = BatchFeed(
            train_data,
            plan,
            device,
            cfg.data.num_workers,
            on_error=cfg.data.on_error,
            grad_accum=place.grad_accum,
            transform=build_batch_transform(cfg.data.augment, channels_last, pixels),
            timer=speed.timer,
            limit=cfg.train.limit_batches,
        )
        if feed.steps_per_epoch == 0:
            raise ConfigError(
                "train.grad_accum", "the DataLoader has fewer batches than one accumulation", place.grad_accum
            )
        total_steps = cfg.train.epochs * feed.steps_per_epoch
        if cfg.train.max_steps is not None:
            total_steps = min(total_steps, cfg.train.max_steps)
        cuda_graphs = cfg.train.cuda_graphs and device.type == "cuda"
        if cfg.train.cuda_graphs and not cuda_graphs:
            console.info(f"train.cuda_graphs: ignored on {device.type} (CUDA graphs need a CUDA device)")
        if dims.pp_enabled:
            log.info("FLOPs are not counted under pipeline parallelism: MFU stays null for this run")

        precision = Precision(place.precision, device)
        if place.fp8 is not None:  # a model converter: before compile and data parallelism wrap the layers
            console.info(apply_fp8(model, place.fp8).describe())
        tokens = _token_norm(task, step_fn, dist, dims)
        # parallelize before the optimizer: FSDP/TP replace the parameters, PP keeps only this rank's stage
        par = parallelize(
            model,
            dist,
            cfg,
            device,
            place.choice,
            place.precision,
            place.grad_accum,
            tp_plan=_tp_plan(tp_plan, model, dims),
            loss_fn=_schedule_loss(task, step_fn, tokens),
            meta_init=meta_init,
        )
        if user_optimizer is None:
            optimizer = build_optimizer(par.model.parameters(), cfg.optim, global_batch, device)
        else:
            optimizer = make_optimizer(user_optimizer, par.model, dims, meta_init is not None, place.fp8 is not None)
        pipeline = par.pipeline
        if pipeline is not None and pipeline.tied is not None:  # the last stage's tied copy follows the first's
            optimizer.register_step_post_hook(lambda *_: pipeline.sync_tied())
        if user_scheduler is None:
            scheduler = build_schedule(optimizer, cfg.optim, total_steps)
        else:
            scheduler = make_scheduler(user_scheduler, optimizer)
        guard = build_guard(
            cfg.train.on_nonfinite,
            optimizer,
            precision,
            device=device,
            distributed=dist.enabled,
            pipelined=dims.pp_enabled,
            window=cfg.log.every_steps,
        )
        record = None
        if user_optimizer is not None or user_scheduler is not None:
            own = " and ".join(
                n for n, arg in (("optimizer=", user_optimizer), ("scheduler=", user_scheduler)) if arg is not None
            )
            on_device = isinstance(guard, DeviceGuard)
            record = describe(optimizer, scheduler, cfg.train.on_nonfinite, on_device, own)
            console.info(describe_line(record))
        compute_loss = loss_of_batch(task, step_fn)
        step = StepParts(
            model=par.step_model,
            optimizer=optimizer,
            scheduler=scheduler,
            precision=precision,
            compute_loss=compute_loss,
            clip_grad_norm=cfg.train.clip_grad_norm,
            clip_grad_value=cfg.train.clip_grad_value,
            pipeline=par.pipeline,
            pp_group=pp_group(dist),
            timer=speed.timer,
            guard=guard,
            time_comm=time_comm,
            params=list(par.step_model.parameters()),
            persistent_grads=cuda_graphs,
            tokens=tokens,
        )
        # how the ranks share a split: plain DDP's replicas each take a share; FSDP, hybrid and TP
        # beside data parallelism too, each data-parallel rank in lockstep; pipeline stages do not
        layout = eval_layout(dist, device, max(1, global_batch // place.grad_accum), dims, graphed=cuda_graphs)
        evaluator = Evaluator(
            par.step_model,
            par.model,
            EvalSpec(task, metric_names, precision.autocast, step_fn=eval_fn or step_fn),
            layout,
            batch_transform=pixels,
            on_error=cfg.data.on_error,
            max_batches=cfg.eval.max_batches,
        )
        for split, data in (eval_splits or {}).items():
            evaluator.check(data, split)
        checkpointer = Checkpointer(cfg.checkpoint, run_path, dist, par.model, optimizer, pipelined=dims.pp_enabled)
        compile_check = None
        if cfg.train.compile or cuda_graphs:
            compile_check = CompileCheck(par.model, compute_loss, precision.autocast, device, dist)
            if cuda_graphs or (dist.enabled and layout.sharing != REPLICATED):
                # a second pass would replay the graphs' pools, or gather and reduce FSDP's shards /
                # TP's and a pipeline's activations once more
                compile_check.skip("CUDA graphs" if cuda_graphs else "sharded or split models")
        metrics = MetricsLogger(
            cfg.log, run_path, dist, console, speed, optimizer, global_batch, total_steps, task.tokens_per_sample
        )
        return TrainingParts(
            place,
            task,
            par.model,
            optimizer,
            scheduler,
            precision,
            step,
            feed,
            global_batch,
            total_steps,
            speed,
            evaluator,
            early_stopping,
            checkpointer,
            metrics,
            console,
            run_path,
            compile_check,
            record,
            TimeBudget(cfg.train.max_time_s),
        )


def build_model_and_data(config: Config, run_dir: str | Path | None = None) -> tuple[nn.Module, DataBundle]:
    """The model and data of a config, from the registries (what `gputrain train` trains): the model on
    the meta device, so that each rank materialises only its own part. A missing device, a precision
    it cannot run (fp8) or a bad run directory fails first, before anything is loaded."""
    from gputrain.data import build_data
    from gputrain.models import build_model

    resolve_precision(config.train.precision, resolve_device(config.train.device)[0])
    if run_dir is not None:
        check_run_dir(run_dir_path(run_dir))
    seed_everything(config.train.seed)
    data = build_data(config.data, config.train.seed)
    return build_model(config.model, data.spec, on_meta=True), data


def _on_meta(model: nn.Module | Callable[[], nn.Module]) -> tuple[nn.Module, MetaInit | None]:
    """The model, and how to materialise it where it is on the meta device (a zero-argument
    function is called there); None for a model with real tensors."""
    if not isinstance(model, nn.Module):
        return build_on_meta(model)
    return (model, prepare_meta_init(model)) if is_meta(model) else (model, None)


def _batch_plan(cfg: Config, train_data: Any, place: Placement) -> tuple[BatchPlan | None, int]:
    """(which samples each step takes, the global batch). A DataLoader's batches are micro-batches."""
    dist = place.dist
    batch_size = cfg.train.batch_size
    assert isinstance(batch_size, int)  # auto was resolved by place_run
    if isinstance(train_data, DataLoader):
        return None, (train_data.batch_size or 1) * place.grad_accum * dist.dp_size
    plan = BatchPlan(
        num_samples=len(train_data),
        global_batch=batch_size,
        grad_accum=place.grad_accum,
        dp_rank=dist.dp_rank,
        dp_size=dist.dp_size,
        seed=cfg.train.seed,
    )
    if plan.steps_per_epoch == 0:
        raise ConfigError("train.batch_size", f"is larger than the {len(train_data)} training samples", batch_size)
    return plan, batch_size


def _token_norm(task: Task, step_fn: ComputeLoss | None, dist: DistContext, dims: ParallelDims) -> TokenNorm | None:
    """How the step normalises a language model's token losses: over the valid tokens of the whole
    global batch, counted over the data-parallel ranks (train/token_loss.py); None where the loss
    stays a mean per micro-batch (other tasks, a user's loss). Under pipeline parallelism, with the
    loss its schedule calls."""
    if task.token_loss is None or step_fn is not None:
        return None
    pipeline = PipelineTokenLoss() if dims.pp_enabled else None
    return TokenNorm(task.token_loss, dist.dp_size, dp_group(dist), pipeline)


def _schedule_loss(task: Task, step_fn: ComputeLoss | None, tokens: TokenNorm | None) -> LossFn | None:
    """The loss a pipeline's schedule calls on its last stage: the token loss's where the step
    normalises over tokens, else the task's (None with a step_fn, which cannot be split into stages)."""
    if step_fn is not None:
        return None
    return tokens.pipeline if tokens is not None and tokens.pipeline is not None else task.loss_fn


def _tp_plan(given: UserTPPlan | None, model: nn.Module, dims: ParallelDims) -> TPPlan | None:
    """The tensor-parallel plan: the user's (a dict for the whole model, or a function of the
    module and the degree), else the built-in family's."""
    if not dims.tp_enabled:
        return None
    if given is None:
        return tp_plan_for(model)
    if callable(given):
        return given
    if dims.pp_enabled:
        raise ConfigError(
            "parallel.tp",
            "a tp_plan dict names the whole model's modules, but pipeline "
            "parallelism splits the model into stages: pass a function (module, tp degree) -> plan",
            dims.tp,
        )
    plan = dict(given)
    return lambda module, degree: plan


def profile_target(
    parts: TrainingParts, config: Config, fit: Callable[[Callable[[], None]], dict[str, Any]]
) -> ProfileTarget:
    """What the profiler needs to know of a run built from `parts`, and `fit`, which runs it."""
    loader, place = parts.feed.loader, parts.place
    return ProfileTarget(
        fit=fit,
        total_steps=parts.total_steps,
        run_dir=parts.run_dir,
        rank=place.dist.rank if place.dist.enabled else None,
        device=place.device,
        precision=place.precision,
        model=parts.model,
        batch_size=parts.global_batch,
        grad_accum=place.grad_accum,
        strategy=place.choice.strategy,
        compiled=config.train.compile,
        fp8=place.fp8.to_dict() if place.fp8 is not None else None,
        loader_workers=loader.num_workers if loader is not None else 0,
        pin_memory=bool(loader.pin_memory) if loader is not None else False,
        loader_applies=parts.feed.tensors is None,
    )
