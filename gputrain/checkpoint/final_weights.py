"""The final model.safetensors of a job whose model is sharded (FSDP, TP) or cut into pipeline
stages, written in place by every rank: no rank ever holds the whole model.

Every rank describes what it holds — each tensor's name, global shape and dtype, and which block
of it its shard is (DTensor's local shape and global offset) — and the ranks exchange these
descriptions (metadata only). From them every rank computes the same plan: the file's layout as
safetensors' own writer lays it out (st_layout.py), tied weights once under the name `save_model`
keeps (the first in sorted order; the others named in `__metadata__`, as it does), and which rank
writes each block (one of the ranks that hold it; blocks that several ranks hold — replicated
tensors, a pipeline's tied matrix, HSDP's replicas — spread over them by size). Rank 0 creates the
file under a temporary name at its full size with the header; each rank then writes its blocks at
their offsets (os.pwrite: a dim-0 shard is one contiguous range of the file, a shard along a later
dimension one range per row), one tensor at a time copied to host memory, and fsyncs; once every
rank has finished, rank 0 renames the file into place. A tensor whose placement is no block (a
strided or partial one) is gathered on its own (`full_tensor`) and written by one rank.

So the file is byte for byte what one process's `save_model` writes of the same weights (where
there is at most one tied group: safetensors orders several `__metadata__` entries at random), and
the loaders read it as such. The run directory must be on storage every rank sees, as for
checkpoints.
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from gputrain.checkpoint.io import fsync_dir
from gputrain.checkpoint.matching import canonical_name
from gputrain.checkpoint.st_layout import Layout, layout
from gputrain.disk_full import removed_if_failed
from gputrain.distributed.context import DistContext
from gputrain.errors import RunError


@dataclass(frozen=True, slots=True)
class Block:
    """What one rank holds of one tensor."""

    name: str
    shape: tuple[int, ...]
    """The whole tensor's."""
    dtype: torch.dtype
    local: tuple[int, ...]
    """The block's shape."""
    offset: tuple[int, ...]
    """Where the block starts in the whole tensor."""
    gathered: bool
    """Its placement is no block: the whole tensor is gathered (collectively) and written from that."""

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.offset, self.local

    @property
    def nbytes(self) -> int:
        return math.prod(self.local) * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Plan:
    layout: Layout
    stored: dict[str, str]
    """Every name any rank holds -> the name its tensor is stored under (a tied alias -> the kept name)."""
    writer: dict[tuple[str, tuple[tuple[int, ...], tuple[int, ...]]], int]
    """(stored name, block key) -> the rank that writes that block."""


def save_sharded_weights(path: Path, model: nn.Module, ctx: DistContext) -> None:
    """Write `path` (model.safetensors) from every rank's part of `model`. Collective."""
    if sys.byteorder != "little":  # safetensors stores little-endian bytes; the blocks are written as held
        raise RunError("the final weights of a sharded model can be written only on a little-endian machine")
    tensors, blocks, ties = held(model)
    token = f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}"  # rank 0's is used
    every: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(every, (blocks, ties, token))
    plan = make_plan([b for b, _, _ in every], [t for _, t, _ in every])
    tmp = path.with_name(every[0][2])
    if ctx.is_main:
        with removed_if_failed(tmp, f"the weights ({path.name})"):
            _write_all(tmp, path, plan, tensors, blocks, ctx)
    else:
        _write_all(tmp, path, plan, tensors, blocks, ctx)


def held(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[Block], list[list[str]]]:
    """This rank's tensors by (canonical) name, the block of each, and its tied groups (names of one tensor)."""
    tensors: dict[str, torch.Tensor] = {}
    names_of: dict[int, list[str]] = {}
    for raw, value in model.state_dict(keep_vars=True).items():
        name = canonical_name(raw)
        tensors[name] = value
        names_of.setdefault(id(value), []).append(name)
    ties = [sorted(names) for names in names_of.values() if len(names) > 1]
    return tensors, [block_of(name, t) for name, t in tensors.items()], ties


def block_of(name: str, tensor: torch.Tensor) -> Block:
    shape = tuple(tensor.shape)
    whole = Block(name, shape, tensor.dtype, shape, (0,) * len(shape), gathered=False)
    if not isinstance(tensor, DTensor):
        return whole
    # exactly Shard/Replicate (not _StridedShard, a subclass): each rank's local tensor is then one block
    if all(type(p) in (Shard, Replicate) for p in tensor.placements):
        local, offset = compute_local_shape_and_global_offset(shape, tensor.device_mesh, tensor.placements)
        if tuple(tensor.to_local().shape) == tuple(local):  # FSDP2's uneven shards: the padding is not in it
            return Block(name, shape, tensor.dtype, tuple(local), tuple(offset), gathered=False)
    return Block(name, shape, tensor.dtype, shape, (0,) * len(shape), gathered=True)


def make_plan(blocks: list[list[Block]], ties: list[list[list[str]]]) -> Plan:
    """The same plan on every rank, from every rank's blocks and tied groups (indexed by rank).

    Raises:
        RuntimeError: the ranks' descriptions disagree, or do not cover a tensor exactly.
    """
    stored = _stored_names(ties)
    for rank_blocks in blocks:
        for block in rank_blocks:
            stored.setdefault(block.name, block.name)
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    holders: dict[tuple[str, tuple[tuple[int, ...], tuple[int, ...]]], list[int]] = {}
    sizes: dict[tuple[str, tuple[tuple[int, ...], tuple[int, ...]]], int] = {}
    for rank, rank_blocks in enumerate(blocks):
        for block in rank_blocks:
            name = stored[block.name]
            spec = (block.shape, block.dtype)
            if specs.setdefault(name, spec) != spec:
                raise RuntimeError(f"{name}: the ranks hold it with different shapes or dtypes ({specs[name]}, {spec})")
            key = (name, block.key)
            if rank not in holders.setdefault(key, []):
                holders[key].append(rank)
            sizes[key] = block.nbytes
    parts: dict[str, list[tuple[tuple[int, ...], tuple[int, ...]]]] = {}
    for name, cell in holders:
        parts.setdefault(name, []).append(cell)
    for name, (shape, _) in specs.items():
        if not _tiles(shape, parts[name]):
            raise RuntimeError(f"{name}: the ranks' shards do not cover it exactly ({parts[name]} of {shape})")
    load = [0] * len(blocks)
    writer = {}
    for key in sorted(holders, key=lambda k: (-sizes[k], k)):  # largest first, each to its least loaded holder
        rank = min(holders[key], key=lambda r: (load[r], r))
        writer[key] = rank
        load[rank] += sizes[key]
    aliases = {name: kept for name, kept in stored.items() if name != kept}
    return Plan(layout(specs, dict(aliases) if aliases else None), stored, writer)


def _tiles(shape: tuple[int, ...], blocks: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> bool:
    """Whether the distinct blocks (offset, local shape) cover the tensor once. Shard and Replicate
    placements cut each dimension into intervals and the blocks are cells of that grid: along every
    dimension the blocks' intervals must partition it, and there must be as many blocks as cells."""
    cells = [(offset, local) for offset, local in blocks if math.prod(local) > 0]  # an empty shard covers nothing
    if math.prod(shape) == 0:
        return True
    count = 1
    for d, size in enumerate(shape):
        at = 0
        for start, length in sorted({(offset[d], local[d]) for offset, local in cells}):
            if start != at:  # a gap, or two intervals that overlap
                return False
            at = start + length
        if at != size:
            return False
        count *= len({(offset[d], local[d]) for offset, local in cells})
    return len(cells) == count


def _stored_names(ties: list[list[list[str]]]) -> dict[str, str]:
    """Each tied name -> the one stored: the first in sorted order, as safetensors' save_model keeps.
    Groups from different ranks that share a name are one group (a pipeline's first and last stage)."""
    groups: list[set[str]] = []
    for group in (set(g) for rank_ties in ties for g in rank_ties):
        for other in [g for g in groups if g & group]:
            group |= other
            groups.remove(other)
        groups.append(group)
    return {name: min(group) for group in groups for name in group}


def _write_all(
    tmp: Path, path: Path, plan: Plan, tensors: dict[str, torch.Tensor], blocks: list[Block], ctx: DistContext
) -> None:
    """Create (rank 0), write every rank's blocks, rename (rank 0); a failure on any rank fails all."""
    failure: BaseException | None = None
    if ctx.is_main:
        failure = _attempt(lambda: _create(tmp, plan.layout))
    _agree(failure, ctx, path)
    failure = _attempt(lambda: _write_mine(tmp, plan, tensors, blocks, ctx))
    _agree(failure, ctx, path)
    if ctx.is_main:
        failure = _attempt(lambda: _commit(tmp, path))
    _agree(failure, ctx, path)  # nobody reads the file before it is in place


def _attempt(step: Any) -> BaseException | None:
    try:
        step()
    except Exception as err:  # noqa: BLE001 - reported to every rank by _agree, then raised
        return err
    return None


def _agree(failure: BaseException | None, ctx: DistContext, path: Path) -> None:
    """Every rank learns whether any failed (collective): the failed rank raises its error, the others
    one naming it (from an OSError with its errno, so a full disk is still said as such)."""
    said: list[Any] = [None] * ctx.world_size
    mine = None if failure is None else (str(failure), getattr(failure, "errno", None))
    dist.all_gather_object(said, mine)
    if failure is not None:
        raise failure
    for rank, report in enumerate(said):
        if report is not None:
            message, code = report
            cause = OSError(code, message) if isinstance(code, int) else None
            raise RunError(f"rank {rank} could not write its part of {path}: {message}") from cause


def _create(tmp: Path, plan: Layout) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        os.ftruncate(fd, plan.size)
        _pwrite_all(fd, memoryview(plan.header), 0)
    finally:
        os.close(fd)


def _write_mine(tmp: Path, plan: Plan, tensors: dict[str, torch.Tensor], blocks: list[Block], ctx: DistContext) -> None:
    """Write the blocks the plan gives this rank, then fsync. Tensors to gather are gathered by every
    rank holding them, in the same (state dict) order, whether or not it writes them, and even after
    a write of this rank failed: a rank that stopped gathering would leave the others waiting."""
    failure: BaseException | None = None
    fd: int | None = None
    try:
        fd = _open_part(tmp)
    except FileNotFoundError as err:  # rank 0 created it: this rank does not see rank 0's files
        failure = RunError(f"{tmp} is not there: the run directory must be on storage every rank sees ({err})")
    except OSError as err:
        failure = err
    done: set[str] = set()
    for block in blocks:
        name = plan.stored[block.name]
        if name in done:  # a tied alias: its tensor is the kept name's
            continue
        done.add(name)
        tensor = tensors[block.name]
        mine = plan.writer[(name, block.key)] == ctx.rank and failure is None
        value = tensor
        if block.gathered:
            assert isinstance(tensor, DTensor)  # block_of gathers only DTensors
            value = tensor.full_tensor()  # collective over its mesh: every holder calls it
        elif isinstance(tensor, DTensor):
            value = tensor.to_local()
        if mine:
            assert fd is not None  # opened, or failure is set
            try:
                _write_block(fd, plan.layout.starts[name], block, value)
            except Exception as err:  # noqa: BLE001 - raised below, once the collectives are done
                failure = err
        del value  # a gathered tensor goes before the next one comes
    if fd is not None:
        try:
            if failure is None:
                os.fsync(fd)
        finally:
            os.close(fd)
    if failure is not None:
        raise failure


def _open_part(tmp: Path) -> int:
    return os.open(tmp, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))


def _write_block(fd: int, start: int, block: Block, value: torch.Tensor) -> None:
    """`value` (the block's elements) at their places in the tensor's bytes, which begin at `start`."""
    host = value.detach().to("cpu").contiguous()  # one tensor at a time in host memory
    if host.numel() == 0:
        return
    raw = memoryview(host.reshape(-1).view(torch.uint8).numpy().data)  # no copy
    size = block.dtype.itemsize
    for at, local_at, count in runs(block.shape, block.local, block.offset):
        _pwrite_all(fd, raw[local_at * size : (local_at + count) * size], start + at * size)


def runs(shape: tuple[int, ...], local: tuple[int, ...], offset: tuple[int, ...]) -> Iterator[tuple[int, int, int]]:
    """The contiguous runs of a block of a row-major tensor: (element offset in the tensor, element
    offset in the block, count). One run where the block is whole past its first dimension (dim-0
    shards); otherwise one per index of the dimensions before the last one it splits."""
    if 0 in local:
        return
    split = [d for d in range(len(shape)) if local[d] != shape[d]]
    if not split:
        yield 0, 0, math.prod(shape)
        return
    k = split[-1]
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    run = local[k] * strides[k]
    for i, index in enumerate(itertools.product(*(range(n) for n in local[:k]))):
        at = sum((offset[d] + index[d]) * strides[d] for d in range(k)) + offset[k] * strides[k]
        yield at, i * run, run


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    while data:
        written = os.pwrite(fd, data, at)
        if written <= 0:
            raise OSError(errno.EIO, "short write")
        data, at = data[written:], at + written


def _commit(tmp: Path, path: Path) -> None:
    """Rank 0, once every rank has written and fsynced its part: into place, then the folder fsynced."""
    tmp.replace(path)
    fsync_dir(path.parent)
