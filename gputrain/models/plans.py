"""The parallel plans of the built-in model families, found by the model's class. Each family's
plan lives beside it (models/gpt_parallel.py, models/mlp.py); a user's model brings its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

TPPlan = Callable[[nn.Module, int], "Mapping[str, ParallelStyle]"]


def tp_plan_for(model: nn.Module) -> TPPlan | None:
    """The function that says how `model` (or a pipeline stage cut from it) splits over a number of
    tensor-parallel ranks; None for a model we know no plan for."""
    from gputrain.models.gpt import GPT
    from gputrain.models.gpt_parallel import gpt_tp_plan
    from gputrain.models.mlp import MLP, mlp_tp_plan

    if isinstance(model, GPT):
        return gpt_tp_plan
    if isinstance(model, MLP):
        return mlp_tp_plan
    return None


PipelineCut = Callable[[nn.Module, list[range], list[int]], tuple[list[nn.Module], "str | None"]]
"""(holder: this rank's copy of the model, the range of units (blocks) of every stage, this rank's
stage ids) -> (this rank's stage modules, the name of the parameter the first and last stages both
use (tied embedding and head) as this rank holds it, or None). The cut turns the layers of other
ranks' stages into nn.Identity in `holder`, so parameter names stay the whole model's."""


def pipeline_cut_for(model: nn.Module) -> tuple[int, PipelineCut] | None:
    """(number of units a stage boundary may fall between, the cut) for a block-stack model family
    we know; None for others (distributed/pp.py cuts any nn.Sequential itself)."""
    from gputrain.models.gpt import GPT
    from gputrain.models.gpt_parallel import gpt_pipeline_stages

    if isinstance(model, GPT):
        return len(model.blocks), gpt_pipeline_stages
    return None
