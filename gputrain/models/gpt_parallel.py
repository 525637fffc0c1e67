"""How models/gpt.py's GPT splits over tensor-parallel ranks (applied by distributed/tp.py) and into
pipeline stages (applied by distributed/pp.py).

Attention and the MLP are each column- then row-wise: `CausalSelfAttention` lays its fused q/k/v
projection out head by head ([head, (q, k, v), head_dim]), so a column split hands each rank whole
heads, and attention runs on them without communication until the output projection. Sequence
parallelism: between blocks the residual stream is split along the sequence, so the LayerNorms run
on 1/tp of the tokens; the embeddings produce sequence shards directly and the head gathers them.
The tied embedding/head weight is sharded the same way on both (by vocabulary rows); tp.py re-ties
them after sharding.

Pipeline stages are ranges of blocks: the first stage also embeds, the last also normalises and
projects to the vocabulary. The tied embedding/head matrix is then held twice, by the first stage
(as `wte.weight`) and by the last (as `lm_head.weight`); pp.py adds the two gradients together and
keeps the copies equal.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from gputrain.errors import ConfigError
from gputrain.models.gpt import GPT, GPTShape


class GPTStage(nn.Module):
    """One pipeline stage of a GPT: [token and position embeddings] → a range of blocks → [final
    norm and head]. Its modules are the model's own (the stage is a view that runs them)."""

    def __init__(self, model: GPT, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.shape: GPTShape = model.shape
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe, self.drop = model.wte, model.wpe, model.drop
        self.blocks = nn.ModuleList(model.blocks[i] for i in blocks)
        if last:
            self.ln_f, self.lm_head = model.ln_f, model.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:  # token ids [B, T] -> the residual stream [B, T, C], as GPT.forward
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.wte(x) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def gpt_pipeline_stages(
    holder: nn.Module, ranges: list[range], stage_ids: list[int]
) -> tuple[list[nn.Module], str | None]:
    """Cut `holder` (this rank's copy of a GPT) into its stages, the blocks of stage s being
    `ranges[s]`; the layers of other ranks' stages become nn.Identity in `holder`, so the parameter
    names stay the whole model's. Returns the stage modules, and the name under which this rank
    holds the embedding/head matrix the first and last stages share (None where it holds neither).
    """
    assert isinstance(holder, GPT)  # models/plans.py hands this cut only GPTs
    if holder.shape.document_end is not None or holder.shape.num_classes is not None:
        # a stage passes only the residual stream on: no document mask, no padding to pool at
        raise ConfigError(
            "parallel.pp",
            "pipeline stages of gpt read plain token windows; packed instruction data and text classes are not cut",
            hint="use ddp or fsdp (or data.pack=false for instructions)",
        )
    num_stages = len(ranges)
    first, last = 0 in stage_ids, num_stages - 1 in stage_ids
    stages: list[nn.Module] = [GPTStage(holder, ranges[s], first=s == 0, last=s == num_stages - 1) for s in stage_ids]
    owned = {i for s in stage_ids for i in ranges[s]}
    for i in range(len(holder.blocks)):
        if i not in owned:
            holder.blocks[i] = nn.Identity()
    if not first:
        holder.wpe = nn.Identity()
    if not last:
        holder.ln_f = nn.Identity()
    if not (first or last):
        holder.wte, holder.lm_head = nn.Identity(), nn.Identity()
    # the first and last stages keep both names of the tied matrix (a one-process checkpoint holds
    # one of them); pp.py keeps the name the stage does not run pointing at the one it does
    tied = "wte.weight" if first else "lm_head.weight" if last else None
    return stages, tied


def gpt_tp_plan(model: nn.Module, tp_degree: int) -> dict[str, ParallelStyle]:
    """Module name → how a GPT is split, for `tp_degree` ranks; `model` may be one pipeline stage.

    Raises:
        ConfigError: the heads do not divide over the ranks (each rank takes whole heads).
    """
    assert isinstance(model, (GPT, GPTStage))  # models/plans.py hands this plan only GPTs and their stages
    if model.shape.document_end is not None or model.shape.num_classes is not None:
        raise ConfigError(
            "parallel.tp",
            "gpt's tensor-parallel plan covers plain token windows, not packed instruction data or text classes",
            tp_degree,
            hint="use ddp or fsdp (or data.pack=false for instructions)",
        )
    if model.shape.n_head % tp_degree:
        raise ConfigError(
            "parallel.tp",
            f"must divide the number of attention heads ({model.shape.n_head}): each rank takes whole heads",
            tp_degree,
        )
    ends: dict[str, ParallelStyle] = {
        # token ids are replicated; the embedding output comes out split along the sequence
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        # positions [T, C] split along T, to add to the [B, T/tp, C] token shard
        "wpe": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        "ln_f": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    # a pipeline stage holds the embeddings only if first, the head only if last; between stages the
    # residual stream travels as each rank's sequence shard
    plan = {name: style for name, style in ends.items() if isinstance(getattr(model, name, None), nn.Module)}
    for i in range(len(model.blocks)):
        block = f"blocks.{i}"
        plan.update(
            {
                f"{block}.ln_1": SequenceParallel(),
                # gather the sequence shards, then split by heads: each rank attends with its own heads
                f"{block}.attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                f"{block}.attn.c_attn": ColwiseParallel(),
                f"{block}.attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
                f"{block}.ln_2": SequenceParallel(),
                f"{block}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                f"{block}.mlp.c_fc": ColwiseParallel(),
                f"{block}.mlp.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            }
        )
    return plan
