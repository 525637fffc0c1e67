"""Turn a Dataset or DataLoader into the micro-batches of each optimizer step, on the device.

In-memory tensor data is indexed a whole batch at a time (no per-sample collate) and, when small,
placed on the GPU once so no step copies from the host. Other datasets go through a DataLoader
driven by the `BatchPlan`; a user's own DataLoader is used as given, its batches as micro-batches.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data._utils.collate import default_collate

from gputrain.data.batches import BatchPlan, PlanBatchSampler
from gputrain.data.guard import GuardedBatch, GuardedDataset, guarded_collate, nothing_readable, unwrap
from gputrain.data.prefetch import prefetch_to_cuda
from gputrain.data.tensors import TensorData
from gputrain.observe.breakdown import StepTimer

log = logging.getLogger("gputrain")

# In-memory data up to this size lives on the GPU for the whole run.
_DEVICE_RESIDENT_BYTES = 2 << 30


def to_device(batch: Any, device: torch.device) -> Any:
    """Move tensors in (nested) tuples/lists/mappings; non_blocking so pinned copies overlap compute.
    A mapping comes back a dict: Hugging Face collators give `BatchEncoding`s, which are no dicts."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True) if batch.device != device else batch
    if isinstance(batch, (list, tuple)):
        moved = [to_device(b, device) for b in batch]
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def _cpus_per_rank() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))  # the cores this process may use (containers, taskset)
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


MAX_AUTO_WORKERS = 16
"""Decoding a photo-sized JPEG to 224×224 takes one core ~4 ms (benchmarks/image_loader_cpu.py),
and ResNet-50 in bf16 on one H100 consumes ~3,000 images/s, so a single-GPU machine's cores are
all needed; the cap only bounds worker memory on very large hosts."""


IN_PROCESS_BATCH_S = 300e-6
"""A micro-batch is read in the training process when reading and collating it costs less than
this: less than a worker's batch costs that process to receive (350-450 us for 64 samples of 32
floats on a 2-core VM, 1.7 ms for 32 images of 3×224×224), and with no worker to start (1.5 s
there) or keep. Samples that are rows of tensors in memory read in about 1-2 us each; a decoded
image file, a tokenised text or a row parsed from disk costs tens of us to ms, and keeps its workers."""

_PROBE_GROUPS, _FIRST_PROBE = 3, 8


def read_seconds_per_batch(
    dataset: Dataset, micro_batch: int, clock: Callable[[], float] = time.perf_counter
) -> float | None:
    """What reading and collating a micro-batch of `dataset` costs: the least time over
    `_PROBE_GROUPS` reads of whole micro-batches spread over the data set (the least, so that a first
    read's one-time cost or another process's load does not count). Timed on whole micro-batches, not
    scaled up from a few samples: collating has a cost per batch that scaling would count per sample.
    A data set that reads a batch at once (`__getitems__`: token windows, Hugging Face datasets) is
    timed so, as the loader reads it.
    A first read of `_FIRST_PROBE` samples that already shows a batch far over IN_PROCESS_BATCH_S
    (image files, say) is the answer: such a data set is not read any further here. None where the
    samples cannot be read or collated so (the loader's guard then names the sample). `clock`: seconds
    (a test passes one its samples advance, so that no machine load changes the answer)."""
    try:
        size = len(cast(Sized, dataset))
    except TypeError:
        return None
    if size == 0:
        return None
    order = torch.randperm(size, generator=torch.Generator().manual_seed(0)).tolist()

    many = getattr(dataset, "__getitems__", None)  # a batch read at once, as the loader's guard reads it

    def read(indices: list[int]) -> float:
        start = clock()
        default_collate(list(many(indices)) if many is not None else [dataset[i] for i in indices])
        return clock() - start

    try:
        read(order[:1])  # untimed: a first read and collate pay one-time costs (imports, caches)
        first = order[:_FIRST_PROBE]
        estimate = read(first) / len(first) * micro_batch
        if estimate > 10 * IN_PROCESS_BATCH_S:
            return estimate
        batch = min(micro_batch, size)
        return min(read([order[(g * batch + k) % size] for k in range(batch)]) for g in range(_PROBE_GROUPS))
    except Exception:  # noqa: BLE001 - user code: the guarded loader reports it with the sample
        return None


def auto_num_workers(
    requested: int | str,
    dataset: Dataset,
    micro_batch: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """data.num_workers=auto: none for in-memory tensors, nor (given the `micro_batch` size) for a
    data set whose micro-batch reads in less than IN_PROCESS_BATCH_S (a sample read is timed on a
    few micro-batches: `read_seconds_per_batch`); else one per spare core of this rank (ranks on a node
    share the cores), at most MAX_AUTO_WORKERS, and at most 2 for a small data set, where starting
    more workers costs more than they save."""
    if requested != "auto":
        return int(requested)
    if isinstance(dataset, TensorData):
        return 0  # indexing tensors in the main process beats any worker round-trip
    if micro_batch is not None and not isinstance(dataset, IterableDataset):
        per_batch = read_seconds_per_batch(dataset, micro_batch, clock)
        if per_batch is not None and per_batch < IN_PROCESS_BATCH_S:
            log.debug("data: read in this process (%.0f us a micro-batch)", per_batch * 1e6)
            return 0
    workers = max(0, min(MAX_AUTO_WORKERS, _cpus_per_rank() - 1))
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return workers
    return min(workers, 2) if size < 2048 else workers


def auto_prefetch_factor(workers: int) -> int | None:
    """Batches each worker keeps ready: about 8 in flight in total, at least 2 per worker."""
    return max(2, 8 // workers) if workers > 0 else None


class BatchFeed:
    """Yields, per optimizer step, the list of this rank's micro-batches already on the device.

    Args:
        data: a Dataset (batched by `plan`) or the user's DataLoader (its batches are micro-batches).
        plan: which samples each step takes; None for a DataLoader.
        device: where the batches go.
        num_workers: data.num_workers (auto: see `auto_num_workers`).
        on_error: data.on_error for samples that cannot be read (fail or skip).
        grad_accum: micro-batches per step, for a DataLoader (a plan knows its own).
        transform: applied to each training micro-batch on the device (see data/augment.py).
        timer: marks the data and host-to-device time of sampled steps.
        limit: at most this many steps per epoch, the first of its order (train.limit_batches).
    """

    def __init__(
        self,
        data: Dataset | DataLoader,
        plan: BatchPlan | None,
        device: torch.device,
        num_workers: int | str = "auto",
        on_error: str = "fail",
        grad_accum: int = 1,
        transform: Callable[[Any], Any] | None = None,
        timer: StepTimer | None = None,
        limit: int | None = None,
    ) -> None:
        self.device = device
        self.limit = limit
        self.on_error = on_error
        self.plan = plan
        self.grad_accum = grad_accum if plan is None else plan.grad_accum
        self.transform = transform
        self.timer = timer if timer is not None else StepTimer(device, every=0)
        self._skipped = 0
        self._warned_skip = False
        self._warned_empty = False
        self._example: str | None = None  # the first unreadable sample, named where a whole split is
        # one process may leave out a step none of whose samples could be read; a rank of several may not
        self._alone = not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1)
        self.loader: DataLoader | None = None
        self.tensors: TensorData | None = None
        self.sampler: PlanBatchSampler | None = None
        """Set where the loader is built here, from the plan (not for a user's DataLoader)."""
        if isinstance(data, DataLoader):
            self.loader = data
        elif isinstance(data, TensorData):
            resident = device.type == "cuda" and data.nbytes <= _DEVICE_RESIDENT_BYTES
            self.tensors = data.to(device) if resident else data
        else:
            assert plan is not None
            workers = auto_num_workers(num_workers, data, plan.micro_batch)
            self.sampler = PlanBatchSampler(plan)
            self.loader = DataLoader(  # guarded: an unreadable sample is named, then failed on or skipped
                GuardedDataset(data),
                batch_sampler=self.sampler,
                collate_fn=guarded_collate,
                num_workers=workers,
                pin_memory=device.type == "cuda",
                persistent_workers=workers > 0,
                prefetch_factor=auto_prefetch_factor(workers),
                # own generator: worker seeding must not draw from the global RNG the model uses
                generator=torch.Generator().manual_seed(plan.seed),
            )

    @property
    def steps_per_epoch(self) -> int:
        if self.plan is not None:
            steps = self.plan.steps_per_epoch
        else:
            assert self.loader is not None
            steps = len(self.loader) // self.grad_accum
        return steps if self.limit is None else min(steps, self.limit)

    def close(self) -> None:
        """Stop the worker processes of the loader built here (they persist between epochs, and
        would outlive the run); the next `epoch` starts new ones. A user's own DataLoader is left
        as its owner made it."""
        if self.sampler is None or self.loader is None:
            return
        iterator = getattr(self.loader, "_iterator", None)  # torch keeps persistent workers' iterator here
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            self.loader._iterator = None
            shutdown()

    def take_skipped(self) -> int:
        """Unreadable samples dropped (data.on_error=skip) since the last call."""
        skipped, self._skipped = self._skipped, 0
        return skipped

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[list[Any]]:
        if self.tensors is not None:
            groups = self._limited(self._tensor_groups(epoch, start_step), start_step)
            if self.tensors.device == self.device:
                for group in groups:  # already on the training device (CPU runs, small data on the GPU)
                    self.timer.mark("h2d")
                    yield self._transformed(group)
                return
        else:
            groups = self._loader_groups(epoch, start_step)  # stops at steps_per_epoch itself
        if self.device.type == "cuda":
            # batch n+1 is copied on a side stream while batch n computes
            for moved in prefetch_to_cuda(groups, self.device, lambda b: to_device(b, self.device), self.timer):
                yield self._transformed(moved)
            return
        for group in groups:
            moved = [to_device(b, self.device) for b in group]
            self.timer.mark("h2d")
            yield self._transformed(moved)

    def _limited(self, groups: Iterator[list[Any]], start_step: int) -> Iterator[list[Any]]:
        """The epoch's first `limit` steps of `groups` (from `start_step` on)."""
        if self.limit is None:
            return groups
        return itertools.islice(groups, max(0, self.steps_per_epoch - start_step))

    def _tensor_groups(self, epoch: int, start_step: int) -> Iterator[list[Any]]:
        """In-memory data: each micro-batch gathered by one index operation where the data lives.
        Host data bound for a GPU is gathered into pinned memory, so its copy can overlap compute."""
        assert self.tensors is not None and self.plan is not None
        tensors = self.tensors
        pin = self.device.type == "cuda" and tensors.device.type == "cpu"
        for step in self.plan.micro_batches(epoch, start_step, device=tensors.device):
            group = [tensors.batch(idx, pin=pin) for idx in step]
            self.timer.mark("data")
            yield group

    def _loader_groups(self, epoch: int, start_step: int) -> Iterator[list[Any]]:
        assert self.loader is not None
        if self.sampler is not None:
            self.sampler.set_epoch(epoch, start_step)
            batches: Iterator[Any] = iter(self.loader)
        else:
            sampler = getattr(self.loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)  # type: ignore[union-attr]
            # a user loader cannot seek: replay and drop the micro-batches already trained on
            batches = itertools.islice(iter(self.loader), start_step * self.grad_accum, None)
        return self._host_groups(batches, start_step)

    def _host_groups(self, batches: Iterator[Any], start_step: int) -> Iterator[list[Any]]:
        """The micro-batches of each remaining step of the epoch, as the loader gives them. With
        data.on_error=skip, a micro-batch none of whose samples could be read is left out, and a step
        left with none is empty: the loop leaves the step out (no update). A whole epoch with no
        readable sample is an error naming the split."""
        per_step = self.grad_accum
        readable = False
        for step in range(start_step, self.steps_per_epoch):
            group = list(itertools.islice(batches, per_step))
            if not group:
                break
            self.timer.mark("data")
            kept = [b for b in map(self._unwrap, group) if b is not None]
            readable = readable or bool(kept)
            if not kept and not self._warned_empty:
                self._warned_empty = True
                log.warning(
                    "no sample of step %d of the epoch could be read (data.on_error=skip): it is left out, with no "
                    "update, and so is any other such step (their samples count in data.skipped_samples)",
                    step + 1,
                )
            yield kept
        if start_step == 0 and not readable and self._example is not None and self.plan is not None:
            raise nothing_readable("train", self.plan.num_samples, self._example)

    def _transformed(self, moved: list[Any]) -> list[Any]:
        """On-device batch work (augmentation, channels_last), charged to the data time."""
        if self.transform is None:
            return moved
        moved = [self.transform(b) for b in moved]
        self.timer.mark("data")
        return moved

    def _unwrap(self, item: Any) -> Any:
        if not isinstance(item, GuardedBatch):
            return item
        batch, skipped = unwrap(item, self.on_error, "train", allow_empty=self._alone)
        if skipped and self._example is None:
            self._example = f"{item.failed[0].where}: {item.failed[0].problem}"
        if skipped and not self._warned_skip:
            self._warned_skip = True
            log.warning(
                "skipping unreadable samples (data.on_error=skip), e.g. train split: %s: %s",
                item.failed[0].where,
                item.failed[0].problem,
            )
        self._skipped += skipped
        return batch


class EvalBatches:
    """Every sample of an evaluation split once, in order, on the device.

    A Dataset read sample by sample goes through the same guard as training (data/guard.py): an
    unreadable sample fails naming the split and the sample (`on_error="fail"`), or is left out and
    counted in `skipped` (`"skip"`), with the first one kept in `example`. In-memory tensors cannot
    fail to read; a user's DataLoader is used as given.
    """

    def __init__(
        self,
        data: Dataset | DataLoader | list[Any],
        batch_size: int,
        device: torch.device,
        on_error: str = "fail",
        split: str | None = None,
    ) -> None:
        self.data, self.batch_size, self.device = data, batch_size, device
        self.on_error, self.split = on_error, split
        self.skipped = 0
        self.example: str | None = None

    def __iter__(self) -> Iterator[Any]:
        data, device = self.data, self.device
        self.skipped, self.example = 0, None  # counts of this pass
        if isinstance(data, (DataLoader, list)):  # batches as they come (a list: some of a loader's)
            for batch in data:
                yield to_device(batch, device)
            return
        if isinstance(data, TensorData):
            size = self.batch_size
            for start in range(0, len(data), size):
                yield to_device(data.rows(slice(start, start + size)).tensors, device)
            return
        loader = DataLoader(
            GuardedDataset(data), batch_size=self.batch_size, shuffle=False, num_workers=0, collate_fn=guarded_collate
        )
        for item in loader:
            batch, skipped = unwrap(item, self.on_error, self.split)
            if skipped:
                self.skipped += skipped
                if self.example is None:
                    self.example = f"{item.failed[0].where}: {item.failed[0].problem}"
            if batch is not None:
                yield to_device(batch, device)
