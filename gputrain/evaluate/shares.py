"""How the ranks of a job share an evaluation split.

Plain DDP (every rank holds the whole model): each rank evaluates its share with the plain module,
no collective in its forward, and the sums are combined. FSDP, hybrid and TP layouts need every rank
of a model replica in every forward pass (parameters are gathered, activations exchanged): each
data-parallel rank still takes its own share, but all ranks make the same number of forward passes
(`Lockstep`): a rank whose share ran out runs a pad batch whose outputs are thrown away, so no rank
waits forever in a collective its peers never reach. TP peers read the same share (they split the
model, not the data), and the figures are combined over the data-parallel ranks only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Subset

from gputrain.data.feed import to_device
from gputrain.data.guard import BadSample
from gputrain.data.tensors import TensorData
from gputrain.distributed.context import DistContext
from gputrain.evaluate.scores import Scores, merge


def shard_for_eval(data: Dataset, rank: int, world_size: int) -> Dataset:
    """This rank's share of an evaluation split: every world_size-th sample from `rank` on.
    Shares differ by at most one sample; none is seen twice and none is padded in."""
    if isinstance(data, TensorData):
        return data.rows(slice(rank, None, world_size))
    return Subset(data, range(rank, len(data), world_size))  # type: ignore[arg-type]


def lockstep_steps(total: int, batch_size: int, shares: int) -> int:
    """Forward passes every rank makes when `shares` ranks split `total` samples in batches of
    `batch_size`: those of the largest share (shares differ by at most one sample)."""
    return math.ceil(math.ceil(total / shares) / batch_size)


def dp_group(ctx: DistContext) -> Any:
    """The process group of the data-parallel ranks that share a split with this one: the world
    unless TP or PP ranks sit beside them (then the mesh's flattened `dp` dimension)."""
    if ctx.mesh is None or ctx.dp_size == ctx.world_size:
        return None  # the default group
    return ctx.mesh["dp"].get_group()


class Lockstep:
    """This rank's batches, then copies of a pad batch: `steps` batches in all, each with whether it
    is real. A batch that cannot be read (data.on_error=fail) ends the real ones: it is kept in
    `unreadable` for the caller to raise after the figures are gathered, when every rank learns of it.

    The pad batch is this rank's first one; a rank with none (an empty or unreadable share) gets
    the first one of the lowest rank that has one, so its forwards have inputs of the right kind (TP
    peers, reading the same share, get the same one). Where no rank has a batch, none is run."""

    def __init__(self, batches: Iterable[Any], steps: int, group: Any, device: torch.device) -> None:
        self.batches, self.steps, self.group, self.device = batches, steps, group, device
        self.unreadable: BadSample | None = None

    def __iter__(self) -> Iterator[tuple[Any, bool]]:
        it = iter(self.batches)
        pad: Any = None
        for i in range(self.steps):
            batch = None
            if self.unreadable is None:
                try:
                    batch = next(it, None)
                except BadSample as err:
                    self.unreadable = err
            if i == 0:
                pad = _agree_on_pad(batch, self.group, self.device)
                if pad is None:
                    return
            yield (pad, False) if batch is None else (batch, True)


def _agree_on_pad(batch: Any, group: Any, device: torch.device) -> Any:
    """`batch`, or where this rank has none, the lowest rank's that has one; None where none has.
    Collective; one small all-reduce when every rank has a batch (the usual case)."""
    have = torch.tensor([0.0 if batch is None else 1.0], device=device)
    dist.all_reduce(have, op=dist.ReduceOp.MIN, group=group)
    if have.item() == 1.0:
        return batch
    size = dist.get_world_size(group)
    flags: list[Any] = [None] * size
    dist.all_gather_object(flags, batch is not None, group=group)
    if not any(flags):
        return None
    src = flags.index(True)
    mine = dist.get_rank(group)
    box = [to_device(batch, torch.device("cpu")) if mine == src else None]
    dist.broadcast_object_list(box, src=src if group is None else dist.get_global_rank(group, src), group=group)
    return batch if batch is not None else to_device(box[0], device)


def gather_scores(kept: Scores | None, group: Any, total: int) -> Scores | None:
    """Every share's scores, on every rank of `group`, merged into the split's (see `in_split_order`)."""
    parts: list[Scores | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, kept, group=group)
    return in_split_order(parts, total)


def in_split_order(parts: list[Scores | None], total: int) -> Scores | None:
    """The scores of a split that ranks evaluated in `shard_for_eval` shares (part r: samples r,
    r+W, ...). Where every share was kept whole (no sample skipped, none subsampled) the rows are
    put back in the split's order, so the file equals one process's; otherwise they are concatenated."""
    world = len(parts)
    whole = all(p is not None and p.total == len(p.scores) == len(range(r, total, world)) for r, p in enumerate(parts))
    if not parts or not whole:
        return merge(parts)
    found = [p for p in parts if p is not None]
    first = found[0]

    def interleave(arrays: list[np.ndarray]) -> np.ndarray:
        out = np.empty((total, *arrays[0].shape[1:]), dtype=arrays[0].dtype)
        for r, array in enumerate(arrays):
            out[r::world] = array
        return out

    ordered = Scores(first.task, interleave([p.scores for p in found]), interleave([p.targets for p in found]), total)
    return merge([ordered])  # subsampled past MAX_ROWS as one process would
