"""Pipeline parallelism with torch.distributed.pipelining: the model is cut into stages by layers,
each pp rank holds its stage(s), and a schedule (gpipe, 1f1b, interleaved_1f1b) streams the
micro-batches of one optimizer step through them. The micro-batches are the accumulation:
`train.grad_accum` of them per step, so the optimisation is the same as without pipelining.

Models: an nn.Sequential (the mlp, or a user's), cut between its parameter-holding layers; and the
block-stack families whose cut lives beside them (models/plans.py: the gpt, by ranges of blocks).
Each rank keeps a copy of the model in which the layers it does not own are replaced by
nn.Identity: parameter names stay those of the whole model, so checkpoints move between pipelined
and other layouts.

A matrix the first and the last stage both use (a GPT's tied embedding and head) is held by both
ranks: after the backward pass the last stage's gradient is added into the first's and dropped, so
the gradient norm counts it once and only the first stage's optimizer updates it; after each
optimizer step the first stage sends the updated matrix to the last (`sync_tied`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)

from gputrain.config.schema import Config
from gputrain.distributed.dtensor import is_dtensor, local_tensor
from gputrain.errors import ConfigError
from gputrain.models.meta import shared_parameters
from gputrain.models.plans import pipeline_cut_for

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def layer_units(model: nn.Sequential) -> list[list[int]]:
    """Child indices grouped into units a stage boundary may not cut: each parameter-holding layer
    with the parameter-free layers after it (activations, dropout); leading ones join the first."""
    units: list[list[int]] = []
    pending: list[int] = []
    for i, child in enumerate(model):
        if any(True for _ in child.parameters()):
            units.append([*pending, i])
            pending = []
        elif units:
            units[-1].append(i)
        else:
            pending.append(i)
    if pending and units:
        units[-1].extend(pending)
    return units


def split_units(num_units: int, num_stages: int) -> list[range]:
    """Contiguous, balanced ranges of units per stage (earlier stages take the remainder)."""
    base, extra = divmod(num_units, num_stages)
    bounds, start = [], 0
    for s in range(num_stages):
        size = base + (1 if s < extra else 0)
        bounds.append(range(start, start + size))
        start += size
    return bounds


class PipelineRunner:
    """This rank's stage modules and the schedule that drives them for one optimizer step."""

    def __init__(
        self,
        holder: nn.Module,
        chunks: list[nn.Module],
        stage_ids: list[int],
        num_stages: int,
        mesh: DeviceMesh,
        schedule: str,
        n_microbatches: int,
        device: torch.device,
        loss_fn: LossFn,
        tied: str | None = None,
    ) -> None:
        self.holder = holder
        self.chunks = chunks
        """This rank's stage modules, in stage order (parallelize wraps them for TP/AC/compile/DP)."""
        self.stage_ids = stage_ids
        self.num_stages = num_stages
        self.group = mesh.get_group()
        self.pp_rank = mesh.get_local_rank()
        self.pp_size = mesh.size()
        self.schedule_name = schedule
        self.n_microbatches = n_microbatches
        self.device = device
        self.loss_fn = loss_fn
        """Loss of one micro-batch's outputs against its targets (computed on the last stage)."""
        self.tied = tied if not (self.has_first and self.has_last) else None
        """The name of this rank's copy of a parameter the first and last stages share, where they
        are on different ranks."""
        self._schedule: Any = None
        self._ties = shared_parameters(holder)

    def restore_ties(self) -> None:
        """Point every name of a shared parameter in the holder at the tensor its stage runs with:
        sharding (TP/FSDP) and materialising replace the parameters of the stage modules only."""
        for names, original in self._ties:
            current = next(
                (getattr(m, n) for m, n in names if getattr(m, n) is not original),
                original,
            )
            for module, name in names:
                setattr(module, name, current)

    @property
    def has_first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def bind(self, chunks: list[nn.Module]) -> None:
        """Build the stages over the final (wrapped) chunks, and the schedule."""
        self.chunks = chunks
        stages = [
            PipelineStage(chunk, sid, self.num_stages, self.device, group=self.group)
            for chunk, sid in zip(chunks, self.stage_ids)
        ]
        cls = _SCHEDULES[self.schedule_name]
        if self.schedule_name == "interleaved_1f1b":
            self._schedule = cls(stages, n_microbatches=self.n_microbatches, loss_fn=self.loss_fn, scale_grads=True)
        else:
            self._schedule = cls(stages[0], n_microbatches=self.n_microbatches, loss_fn=self.loss_fn, scale_grads=True)

    def _last_rank(self) -> int:
        return dist.get_global_rank(self.group, (self.num_stages - 1) % self.pp_size)

    def _first_rank(self) -> int:
        return dist.get_global_rank(self.group, 0)

    def _add_tied_grads(self) -> None:
        """The last stage's gradient of the shared matrix into the first stage's; dropped on the last."""
        if self.tied is None:
            return
        param = self.holder.get_parameter(self.tied)
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        elif is_dtensor(param.grad) and is_dtensor(param) and param.grad.placements != param.placements:
            # a tensor-parallel embedding's gradient comes back replicated: shard it as the weight
            # is, so both stages exchange the same rows
            param.grad = param.grad.redistribute(param.device_mesh, param.placements)
        grad = local_tensor(param.grad)
        if self.has_first:
            received = torch.empty_like(grad)
            dist.recv(received, src=self._last_rank(), group=self.group)
            grad.add_(received)
        else:
            dist.send(grad.contiguous(), dst=self._first_rank(), group=self.group)
            param.grad = None  # not counted twice in the norm, not stepped twice: sync_tied copies the update

    @torch.no_grad()
    def sync_tied(self) -> None:
        """After an optimizer step: the first stage's updated shared matrix to the last stage's copy."""
        if self.tied is None:
            return
        value = local_tensor(self.holder.get_parameter(self.tied))
        if self.has_first:
            dist.send(value.contiguous(), dst=self._last_rank(), group=self.group)
        else:
            received = torch.empty_like(value)
            dist.recv(received, src=self._first_rank(), group=self.group)
            value.copy_(received)

    def step(self, micro_batches: list[Any]) -> torch.Tensor:
        """Forward and backward all micro-batches; returns the mean loss (the same on every pp rank)."""
        inputs = torch.cat([b[0] for b in micro_batches])
        targets = torch.cat([b[1] for b in micro_batches])
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first else ()
        if self.has_last:
            self._schedule.step(*args, target=targets, losses=losses)
            loss = torch.stack([x.detach().float() for x in losses]).mean()
        else:
            self._schedule.step(*args)
            loss = torch.zeros((), device=self.device)
        self._add_tied_grads()
        # the loss exists on the last stage only; share it so logging and summaries see it everywhere
        dist.broadcast(loss, src=self._last_rank(), group=self.group)
        return loss

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Evaluation forward of any batch size, by plain point-to-point sends (the training schedule's
        buffers are sized for the training micro-batch). Returns the outputs on every pp rank."""
        x = inputs
        for sid in range(self.num_stages):
            owner = sid % self.pp_size
            if owner == self.pp_rank:
                x = self.chunks[self.stage_ids.index(sid)](x)
            x = self._broadcast_tensor(x if owner == self.pp_rank else None, owner)
        return x

    def _broadcast_tensor(self, value: torch.Tensor | None, owner: int) -> torch.Tensor:
        src = dist.get_global_rank(self.group, owner)
        meta: list[Any] = [None if value is None else (tuple(value.shape), value.dtype)]
        dist.broadcast_object_list(meta, src=src, group=self.group)
        shape, dtype = meta[0]  # the owner's: every rank gets a pair
        out = value.contiguous() if value is not None else torch.empty(shape, dtype=dtype, device=self.device)
        dist.broadcast(out, src=src, group=self.group)
        return out


class PipelineForward(nn.Module):
    """Makes the pipeline callable like a model, for evaluation."""

    def __init__(self, runner: PipelineRunner) -> None:
        super().__init__()
        self.runner = runner
        self.holder = runner.holder

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.runner.forward(inputs)


def check_pipeline(model: nn.Module, pp: int, schedule: str, n_microbatches: int | None = None) -> None:
    """Refuse a pipeline of `pp` ranks that `model` cannot take: a model that cannot be cut, fewer
    layers (blocks) than stages, or (where `n_microbatches` is given) too few micro-batches for the
    schedule. What `apply_pp` checks before cutting, and `gputrain plan` before measuring.

    Raises:
        ConfigError: naming parallel.pp or train.grad_accum, and what would be right.
    """
    cut = pipeline_cut_for(model)
    if cut is not None:
        num_units = cut[0]
    elif isinstance(model, nn.Sequential):
        num_units = len(layer_units(model))
    else:
        raise ConfigError(
            "parallel.pp",
            f"pipeline parallelism cuts nn.Sequential models (the mlp, or a Sequential of your own) between "
            f"layers, and the gpt between blocks; {type(model).__name__} is neither",
            pp,
            hint="use parallel.strategy=fsdp or tp for this model",
        )
    virtual = 2 if schedule == "interleaved_1f1b" else 1
    num_stages = pp * virtual
    if num_units < num_stages:
        what = "layers with parameters" if cut is None else "blocks"
        raise ConfigError(
            "parallel.pp",
            f"the model has {num_units} {what}, fewer than the "
            f"{num_stages} pipeline stages ({pp} ranks × {virtual} with {schedule})",
            pp,
        )
    if n_microbatches is None:
        return
    if schedule != "gpipe" and n_microbatches < pp:
        raise ConfigError(
            "train.grad_accum",
            f"the {schedule} schedule needs at least parallel.pp={pp} micro-batches per step",
            n_microbatches,
            hint=f"set train.grad_accum={pp} or more",
        )
    if schedule == "interleaved_1f1b" and n_microbatches % pp:
        raise ConfigError(
            "train.grad_accum",
            f"interleaved_1f1b needs a multiple of parallel.pp={pp} micro-batches per step",
            n_microbatches,
        )


def apply_pp(
    model: nn.Module, mesh: DeviceMesh, config: Config, device: torch.device, n_microbatches: int, loss_fn: LossFn
) -> tuple[nn.Module, PipelineRunner]:
    """Cut `model` into stages; return this rank's holder module (parameters, state dict) and runner.

    Raises:
        ConfigError: the model cannot be cut (not a Sequential, too few layers) or the schedule needs
            more micro-batches (`check_pipeline`).
    """
    pp, schedule = mesh.size(), config.parallel.pp_schedule
    check_pipeline(model, pp, schedule, n_microbatches)
    cut = pipeline_cut_for(model)
    num_stages = pp * (2 if schedule == "interleaved_1f1b" else 1)
    units = layer_units(model) if isinstance(model, nn.Sequential) else []
    num_units = len(units) if cut is None else cut[0]
    holder = copy.deepcopy(model)
    ranges = split_units(num_units, num_stages)
    pp_rank = mesh.get_local_rank()
    stage_ids = [s for s in range(num_stages) if s % pp == pp_rank]  # interleaved: stages r, r+pp, ...
    if cut is not None:
        chunks, tied = cut[1](holder, ranges, stage_ids)
    else:
        assert isinstance(holder, nn.Sequential)  # checked above: a model without a cut of its own is one
        chunks, tied = _cut_sequential(holder, units, ranges, stage_ids), None
    runner = PipelineRunner(
        holder, chunks, stage_ids, num_stages, mesh, schedule, n_microbatches, device, loss_fn, tied=tied
    )
    return holder, runner


def _cut_sequential(
    holder: nn.Sequential, units: list[list[int]], ranges: list[range], stage_ids: list[int]
) -> list[nn.Module]:
    """This rank's stages of a Sequential, each a Sequential of its units' layers; the others' layers
    become nn.Identity in `holder`."""
    owned = {i for s in stage_ids for u in ranges[s] for i in units[u]}
    for i in range(len(holder)):
        if i not in owned:
            holder[i] = nn.Identity()  # keeps the numbering, hence the parameter names
    return [nn.Sequential(*(holder[i] for u in ranges[s] for i in units[u])) for s in stage_ids]
