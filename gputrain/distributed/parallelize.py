"""Apply parallelism to a model in one fixed place. Model code knows nothing of it.

Order (torchtitan's): tensor parallel → activation checkpointing → compile → FSDP/DDP. TP first
because it rewrites the parameters into DTensors the others then wrap; AC before compile so the
compiler sees the recomputation; data parallelism last so it shards/replicates what is finally run.
Pipeline parallelism cuts the model into this rank's stage before any of them. A model built on
the meta device goes through all of it there and is materialised (this rank's part only,
models/meta.py) after FSDP and before DDP, which broadcasts real values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from gputrain.config.schema import Config
from gputrain.distributed.auto import StrategyChoice
from gputrain.distributed.compiling import CompileScope, compile_in_place
from gputrain.distributed.context import DistContext
from gputrain.distributed.parallel_dims import ParallelDims, dims_for_strategy
from gputrain.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from gputrain.distributed.pp import PipelineRunner
    from gputrain.models.meta import MetaInit

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
TPPlan = Callable[[nn.Module, int], "Mapping[str, ParallelStyle]"]
"""(module, tp degree) -> {module name: how it splits}; see distributed/tp.py."""


@dataclass(slots=True)
class Parallelized:
    model: nn.Module
    """The module that holds this rank's parameters (state dicts and the optimizer use it)."""
    step_model: nn.Module
    """The module the training step calls (DDP-wrapped, compiled, ... as configured)."""
    pipeline: PipelineRunner | None = None
    """Pipeline schedule driving forward and backward when pipeline parallelism is on."""


def setup_parallel(
    ctx: DistContext, choice: StrategyChoice, config: Config, device: torch.device
) -> tuple[DistContext, ParallelDims]:
    """Resolve the degrees and build the device mesh. Returns this rank's context in that layout (a
    new one, with the mesh and this rank's data-parallel coordinates) and the degrees."""
    dims = dims_for_strategy(choice.strategy, config.parallel, ctx.world_size)
    mesh = dims.build_mesh(device.type) if ctx.enabled else None
    laid_out = replace(ctx, dp_rank=dims.dp_rank(ctx.rank), dp_size=dims.dp_size, dims=dims, mesh=mesh)
    return laid_out, dims


def parallelize(
    model: nn.Module,
    ctx: DistContext,
    config: Config,
    device: torch.device,
    choice: StrategyChoice,
    precision: str = "fp32",
    grad_accum: int = 1,
    tp_plan: TPPlan | None = None,
    loss_fn: LossFn | None = None,
    meta_init: MetaInit | None = None,
) -> Parallelized:
    """Apply the chosen parallelisms in the fixed order; unchanged on one process with strategy none.

    With pipeline parallelism each of this rank's stage modules goes through the same order. A model
    built on the meta device (`meta_init` given) is cut, split and sharded there, then this rank's
    part is materialised on `device` (models/meta.py), before DDP, which broadcasts real values.

    Args:
        tp_plan: how the model's modules split for tensor parallelism, as a function of the module
            (the whole model, or one pipeline stage's chunk) and the tp degree (see tp.py).
        loss_fn: the loss of one micro-batch's outputs against its targets, which a pipeline
            schedule computes on the last stage.
        meta_init: how to materialise `model`, which is on the meta device.

    Raises:
        ConfigError: tensor parallelism without a plan, or pipeline parallelism without a loss_fn.
    """
    dims, mesh = ctx.dims, ctx.mesh
    if dims is not None and dims.tp_enabled and tp_plan is None:
        raise ConfigError(
            "parallel.tp",
            f"tensor parallelism needs a plan for {type(model).__name__}: pass "
            "tp_plan={'layer.name': ColwiseParallel(), ...} (torch.distributed.tensor.parallel) to "
            "the Trainer; the built-in mlp and gpt models have theirs",
            dims.tp,
            hint="or use parallel.strategy=fsdp or ddp for this model",
        )
    pipeline = None
    if dims is not None and dims.pp_enabled:
        from gputrain.distributed.pp import apply_pp

        if loss_fn is None:
            raise ConfigError(
                "parallel.strategy",
                "pipeline parallelism computes the loss on the last stage: pass "
                "loss_fn(outputs, targets) to the Trainer (step_fn cannot be split into stages)",
                config.parallel.strategy,
            )
        assert mesh is not None  # dims come with a mesh when the job is distributed
        model, pipeline = apply_pp(model, mesh["pp"], config, device, grad_accum, loss_fn)
    # module names as built, before activation checkpointing wraps the blocks: materialising finds them so
    targets = dict(model.named_modules()) if meta_init is not None else {}
    chunks = pipeline.chunks if pipeline is not None else [model]
    for i, chunk in enumerate(chunks):
        chunks[i] = _shard_in_order(chunk, dims, mesh, choice, config, device, precision, tp_plan)
    if meta_init is not None:
        meta_init.materialize(list(chunks), targets, device)
    if pipeline is not None:
        pipeline.restore_ties()
    if dims is not None and dims.ddp_enabled and not dims.fsdp_enabled:
        from gputrain.distributed.ddp import apply_ddp

        assert mesh is not None  # dims come with a mesh when the job is distributed
        chunks = [apply_ddp(chunk, mesh["dp_replicate"], device) for chunk in chunks]
    if pipeline is not None:
        from gputrain.distributed.pp import PipelineForward

        pipeline.bind(chunks)
        return Parallelized(model=model, step_model=PipelineForward(pipeline), pipeline=pipeline)
    return Parallelized(model=model, step_model=chunks[0])


def _shard_in_order(
    model: nn.Module,
    dims: ParallelDims | None,
    mesh: Any,
    choice: StrategyChoice,
    config: Config,
    device: torch.device,
    precision: str,
    tp_plan: TPPlan | None,
) -> nn.Module:
    """TP → activation checkpointing → compile → FSDP on one module; returns what to call (DDP,
    which needs real values, comes after materialising)."""
    if dims is not None and dims.tp_enabled and tp_plan is not None:
        from gputrain.distributed.tp import apply_tp

        apply_tp(model, mesh["tp"], tp_plan(model, mesh["tp"].size()))
    if choice.activation_checkpointing != "none":
        from gputrain.distributed.ac import apply_ac

        model = apply_ac(model, choice.activation_checkpointing)
    cuda_graphs = config.train.cuda_graphs and device.type == "cuda"
    if config.train.compile or cuda_graphs:
        compile_in_place(model, "reduce-overhead" if cuda_graphs else None, scope=compile_scope(dims, choice))
    if dims is not None and dims.fsdp_enabled:
        from gputrain.distributed.fsdp import apply_fsdp

        dp_mesh = mesh["dp_replicate", "dp_shard"] if dims.dp_replicate > 1 else mesh["dp_shard"]
        apply_fsdp(model, dp_mesh, precision, config.parallel.cpu_offload)
    return model


def compile_scope(dims: ParallelDims | None, choice: StrategyChoice) -> CompileScope:
    """The whole model where nothing wraps its blocks (one process, DDP: torch's DDPOptimizer splits
    the graph at the gradient buckets, so the all-reduces still overlap backward); block by block
    under tensor parallelism and in a pipeline stage (torchtitan's scope); every child of an
    nn.Sequential too under FSDP and activation checkpointing, whose hooks and wrappers sit around
    each child: compiled inside them."""
    if (dims is not None and dims.fsdp_enabled) or choice.activation_checkpointing != "none":
        return "children"
    if dims is not None and (dims.tp_enabled or dims.pp_enabled):
        return "blocks"
    return "model"


def describe_choice(choice: StrategyChoice, ctx: DistContext) -> str:
    """One line for the console: the strategy, the mesh, and for auto the numbers behind it."""
    mesh = ctx.dims.describe() if ctx.dims is not None else "one process"
    line = f"parallel: {choice.strategy} on {ctx.world_size} rank(s) ({mesh})"
    if choice.activation_checkpointing != "none":
        line += f", activation checkpointing {choice.activation_checkpointing}"
    return line + (f"\n  {choice.reason}" if choice.reason else "")


def pp_group(ctx: DistContext) -> Any:
    """The pipeline's process group, or None without pipeline parallelism."""
    if ctx.dims is None or not ctx.dims.pp_enabled or ctx.mesh is None:
        return None
    return ctx.mesh["pp"].get_group()
