"""distributed/parallelize.py without a process group: the laid-out context is a new one, and a model
with no tensor-parallel plan is refused by name (the 2-rank twins: tests/dist/test_equivalence.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from gputrain.config import load_config
from gputrain.distributed.auto import StrategyChoice
from gputrain.distributed.context import DistContext
from gputrain.distributed.parallel_dims import dims_for_strategy
from gputrain.distributed.parallelize import compile_scope, parallelize, setup_parallel
from gputrain.errors import ConfigError

CPU = torch.device("cpu")


def test_setup_parallel_returns_a_laid_out_copy_and_leaves_the_context_it_was_given() -> None:
    given = DistContext()
    laid_out, dims = setup_parallel(given, StrategyChoice("none", "none"), load_config(None), CPU)
    assert laid_out is not given and laid_out.dims is dims and (laid_out.dp_rank, laid_out.dp_size) == (0, 1)
    assert given == DistContext()  # nothing is wired onto the context init_distributed made
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.dims = dims  # type: ignore[misc]


def test_a_user_model_under_tp_without_a_plan_is_a_config_error_naming_tp_plan() -> None:
    """Two TP ranks as the layout sees them (no process group is needed: the check comes first)."""
    config = load_config(None, ["parallel.strategy=tp"])
    dims = dims_for_strategy("tp", config.parallel, 2)
    ctx = DistContext(rank=0, world_size=2, local_rank=0, dp_rank=0, dp_size=dims.dp_size, dims=dims)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(ConfigError) as err:
        parallelize(model, ctx, config, CPU, StrategyChoice("tp", "none"), tp_plan=None)
    assert err.value.field == "parallel.tp"
    assert "tp_plan={'layer.name': ColwiseParallel(), ...}" in str(err.value) and "Sequential" in str(err.value)


@pytest.mark.parametrize(
    ("strategy", "world", "ac", "scope"),
    [
        ("none", 1, "none", "model"),  # nanoGPT's scope: one graph, nothing eager between the blocks
        ("ddp", 2, "none", "model"),  # DDPOptimizer splits the graph at the buckets
        ("none", 1, "full", "children"),  # the checkpoint wrappers sit around each block
        ("ddp", 2, "selective", "children"),
        ("fsdp", 2, "none", "children"),  # FSDP's gathers between the blocks
        ("tp", 2, "none", "blocks"),  # torchtitan's: the redistributions stay between the blocks
        ("pp", 2, "none", "blocks"),  # a stage's chunk
    ],
)
def test_the_compile_scope_is_the_whole_model_where_nothing_wraps_the_blocks(
    strategy: str, world: int, ac: str, scope: str
) -> None:
    config = load_config(None, [f"parallel.strategy={strategy}"])
    dims = dims_for_strategy(strategy, config.parallel, world)  # type: ignore[arg-type]
    assert compile_scope(dims, StrategyChoice(strategy, ac)) == scope  # type: ignore[arg-type]
    assert compile_scope(None, StrategyChoice("none", "none")) == "model"
