"""Which samples go into each micro-batch, on each rank, at each step of each epoch.

The order of an epoch is a permutation seeded by (seed, epoch). Step s of the epoch uses the
global batch perm[s·B : (s+1)·B]; its accumulation chunk j holds N·b samples, of which rank r
takes its own b. So N ranks × micro-batch b see exactly the samples of 1 process × batch N·b,
and a resumed run can start at any step without replaying the data before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gputrain.env.device import queued_copy


@dataclass(slots=True)
class BatchPlan:
    num_samples: int
    """Samples in the training set."""
    global_batch: int
    """train.batch_size: samples per optimizer step over all ranks and accumulation steps."""
    grad_accum: int
    """Micro-batches per optimizer step on each rank."""
    dp_rank: int = 0
    dp_size: int = 1
    seed: int = 0
    shuffle: bool = True

    @property
    def micro_batch(self) -> int:
        return self.global_batch // (self.grad_accum * self.dp_size)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch: full global batches only, so no rank ever waits on a short one."""
        return self.num_samples // self.global_batch

    def epoch_order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def micro_batches(
        self, epoch: int, start_step: int = 0, device: torch.device | None = None
    ) -> Iterator[list[torch.Tensor]]:
        """For each optimizer step from `start_step`: this rank's micro-batch indices.

        Args:
            device: where the indices are wanted (data held on the GPU is indexed there). The
                epoch's order crosses once, here; every micro-batch is then a slice of it, so no
                step pays a host-to-device copy (from pageable memory, one that waits for the GPU).
        """
        order = _on_device(self.epoch_order(epoch), device)
        b, n = self.micro_batch, self.dp_size
        for step in range(start_step, self.steps_per_epoch):
            base = step * self.global_batch
            yield [
                order[base + j * n * b + self.dp_rank * b : base + j * n * b + (self.dp_rank + 1) * b]
                for j in range(self.grad_accum)
            ]


class PlanBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Feeds a DataLoader the micro-batches of a `BatchPlan`, one epoch (from one step) at a time."""

    def __init__(self, plan: BatchPlan) -> None:
        self.plan = plan
        self.epoch = 0
        self.start_step = 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = epoch, start_step

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.plan.micro_batches(self.epoch, self.start_step):
            for micro in step:
                yield micro.tolist()

    def __len__(self) -> int:
        return (self.plan.steps_per_epoch - self.start_step) * self.plan.grad_accum


def _on_device(order: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    return order if device is None else queued_copy(order, device)
