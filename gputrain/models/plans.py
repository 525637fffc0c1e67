"""The parallel plans of the built-in model families, found by the model's class. Each family's
plan lives beside it (models/gpt_parallel.py, models/mlp.py); a user's model brings its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

TPPlan = Callable[[nn.Module, int], Mapping[str, ParallelStyle]]


def tp_plan_for(model: nn.Module) -> TPPlan | None:
    """The function that says how `model` (or a pipeline stage cut from it) splits over a number of
    tensor-parallel ranks; None for a model we know no plan for."""
    from gputrain.models.gpt import GPT
    from gputrain.models.gpt_parallel import gpt_tp_plan
    from gputrain.models.mlp import MLP, mlp_tp_plan

    if isinstance(model, GPT):
        return gpt_tp_plan  # type: ignore[return-value]
    if isinstance(model, MLP):
        return mlp_tp_plan
    return None
