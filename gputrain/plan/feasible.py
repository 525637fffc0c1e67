"""What `gputrain plan` refuses or leaves out before it measures anything, so that every answer is
a message and the work is bounded whatever the numbers asked.

- The world size (--nproc-per-node × --nnodes): at most `RANKS_MAX`, the limit of every parallel
  degree in the config (config/limits.py).
- The layout the config asks for (a strategy other than auto), as `train` would lay it out on that
  many ranks: the degrees multiply to the world size (parallel_dims.py), a pipeline has no more
  stages than the model has blocks and enough micro-batches for its schedule (distributed/pp.py),
  tensor-parallel ranks split the model as its plan allows (a GPT's heads divide over them).
  Refused with train's one-line message, naming the field (exit 2).
- Each strategy the plan shows on all the ranks (tp and pp at the whole world's degree): a row the
  model cannot take (more stages than blocks, heads that do not divide, no plan to split it) is
  left out, and the plan says which and why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputrain.config.limits import RANKS_MAX
from gputrain.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from torch import nn

    from gputrain.config.schema import Config
    from gputrain.distributed.parallel_dims import Strategy


def plan_world(nproc_per_node: int, nnodes: int) -> int:
    """The ranks the plan is for, each count and their product within `RANKS_MAX`.

    Raises:
        UsageError: naming the option and the limit.
    """
    counts = (("--nproc-per-node", nproc_per_node, "ranks per node, one device each"), ("--nnodes", nnodes, "nodes"))
    for option, value, what in counts:
        if not 1 <= value <= RANKS_MAX:
            raise UsageError(f"{option} {value}: must be 1..{RANKS_MAX} ({what})")
    world = nproc_per_node * nnodes
    if world > RANKS_MAX:
        raise UsageError(
            f"--nproc-per-node {nproc_per_node} × --nnodes {nnodes} = {world} ranks: at most {RANKS_MAX}, "
            "the limit of every parallel degree"
        )
    return world


def check_degrees(config: Config, world: int) -> None:
    """The configured strategy's degrees fit `world` ranks as train lays them out (auto: always).

    Raises:
        ConfigError: naming the parallel.* fields and the world size.
    """
    from gputrain.distributed.parallel_dims import dims_for_strategy

    par = config.parallel
    if par.strategy != "auto" and par.strategy != "tuned":  # tuned: a layout gputrain tune measured, or auto's
        dims_for_strategy(par.strategy, par, world)


def check_model_layout(config: Config, model: nn.Module, world: int, micro_batches: int) -> None:
    """The configured strategy's tensor and pipeline degrees suit `model` (on the meta device).

    Raises:
        ConfigError: naming parallel.tp, parallel.pp or train.grad_accum, and what would be right.
    """
    from gputrain.distributed.parallel_dims import dims_for_strategy
    from gputrain.distributed.pp import check_pipeline

    par = config.parallel
    if par.strategy == "auto" or par.strategy == "tuned":
        return
    dims = dims_for_strategy(par.strategy, par, world)
    if dims.tp > 1:
        check_tp(model, dims.tp)
    if dims.pp > 1:
        check_pipeline(model, dims.pp, par.pp_schedule, micro_batches)


def check_tp(model: nn.Module, tp: int) -> None:
    """`model` splits over `tp` tensor-parallel ranks by its family's plan (models/plans.py).

    Raises:
        ConfigError: the model has no plan, or the plan refuses the degree (a GPT's heads).
    """
    from gputrain.models.plans import tp_plan_for

    plan = tp_plan_for(model)
    if plan is None:
        raise ConfigError(
            "parallel.tp",
            f"tensor parallelism has no plan for {type(model).__name__}: the built-in mlp and gpt models have theirs",
            tp,
            hint="use parallel.strategy=fsdp or ddp for this model",
        )
    plan(model, tp)


def row_problem(model: nn.Module, strategy: Strategy, world: int, pp_schedule: str) -> str | None:
    """Why the plan's row of `strategy` on all `world` ranks cannot be laid out for `model`; None
    where it can. Only the model's shape counts here: the micro-batches a schedule needs are the
    config's to change."""
    from gputrain.distributed.pp import check_pipeline

    if strategy == "none" and world > 1:  # not a layout of `world` ranks: a row would read as one that fits
        return f"trains on one process; launched on {world} ranks it is refused (parallel.strategy=none)"
    try:
        if strategy == "tp":
            check_tp(model, world)
        elif strategy == "pp":
            check_pipeline(model, world, pp_schedule)
    except ConfigError as err:
        return f"{err.field}={world}: {err.problem}"
    return None
