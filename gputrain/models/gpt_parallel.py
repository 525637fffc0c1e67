"""How models/gpt.py's GPT splits over tensor-parallel ranks (applied by distributed/tp.py).

Attention and the MLP are each column- then row-wise: `CausalSelfAttention` lays its fused q/k/v
projection out head by head ([head, (q, k, v), head_dim]), so a column split hands each rank whole
heads, and attention runs on them without communication until the output projection. Sequence
parallelism: between blocks the residual stream is split along the sequence, so the LayerNorms run
on 1/tp of the tokens; the embeddings produce sequence shards directly and the head gathers them.
The tied embedding/head weight is sharded the same way on both (by vocabulary rows); tp.py re-ties
them after sharding.
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

from gputrain.errors import ConfigError
from gputrain.models.gpt import GPT


def gpt_tp_plan(model: GPT, tp_degree: int) -> dict[str, ParallelStyle]:
    """Module name → how it is split, for `tp_degree` ranks.

    Raises:
        ConfigError: the heads do not divide over the ranks (each rank takes whole heads).
    """
    if model.shape.n_head % tp_degree:
        raise ConfigError(
            "parallel.tp",
            f"must divide the number of attention heads ({model.shape.n_head}): each rank takes whole heads",
            tp_degree,
        )
    plan: dict[str, ParallelStyle] = {
        # token ids are replicated; the embedding output comes out split along the sequence
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        # positions [T, C] split along T, to add to the [B, T/tp, C] token shard
        "wpe": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        "ln_f": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
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
