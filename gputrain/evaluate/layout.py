"""How a job evaluates a split, decided once when the job is built: `EvalLayout`, which both the
training loop (train/build.py) and `gputrain evaluate` (use/evaluate.py) hand the `Evaluator`.

Three ways the ranks take a split (shares.py says how each runs):
- WHOLE: every rank evaluates all of it (one process, pipeline stages, a DataLoader split);
- REPLICATED: every rank holds the whole model (plain DDP, or `evaluate` under torchrun): each
  evaluates its share with the plain module and the figures are combined;
- LOCKSTEP: the forward is collective (FSDP, hybrid, TP beside data parallelism): each
  data-parallel rank evaluates its share, all making the same number of forward passes, and the
  figures are combined over the data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from gputrain.distributed.context import DistContext
from gputrain.distributed.parallel_dims import ParallelDims
from gputrain.evaluate.shares import dp_group

Sharing = Literal["whole", "replicated", "lockstep"]
WHOLE: Sharing = "whole"
REPLICATED: Sharing = "replicated"
LOCKSTEP: Sharing = "lockstep"


@dataclass(frozen=True, slots=True)
class EvalLayout:
    """Where and how this rank evaluates a split."""

    sharing: Sharing
    rank: int
    """This rank's share (its rank, or its data-parallel rank under LOCKSTEP)."""
    shares: int
    """How many shares a split is cut into (1 for WHOLE)."""
    device: torch.device
    batch_size: int
    """Samples per evaluation batch on one rank, before a split is shared out (training's micro-batch)."""
    graphed: bool = False
    """The training step's model replays CUDA graphs (train.cuda_graphs): its outputs are copied out."""
    group: Any = None
    """The process group the shares are combined over (None: all ranks)."""

    def shared(self, total: int) -> bool:
        """Whether a data set of `total` samples is shared out: not where a rank would get no
        sample (it would skip the gathering its peers wait in)."""
        return self.sharing != WHOLE and total >= self.shares


def eval_layout(
    dist: DistContext,
    device: torch.device,
    batch_size: int,
    dims: ParallelDims | None = None,
    graphed: bool = False,
) -> EvalLayout:
    """The layout of a job of `dims` (None: every rank holds the whole model, as `gputrain evaluate`
    loads it). Pipeline stages each hold a part of the model: every rank evaluates the whole split."""
    if not dist.enabled or (dims is not None and dims.pp_enabled):
        return EvalLayout(WHOLE, 0, 1, device, batch_size, graphed)
    if dims is None or (dims.ddp_enabled and dims.dp_replicate == dist.world_size):
        return EvalLayout(REPLICATED, dist.rank, dist.world_size, device, batch_size, graphed)
    if dims.dp_size > 1 and dist.dp_size > 1:
        return EvalLayout(LOCKSTEP, dist.dp_rank, dist.dp_size, device, batch_size, graphed, dp_group(dist))
    return EvalLayout(WHOLE, 0, 1, device, batch_size, graphed)  # TP alone: every rank on the whole split
