"""`train.batch_size=auto` and `train.micro_batch_size=auto`: the largest micro-batch that fits.

First the plan: the step measured on fake tensors at 1 and 2 samples gives the bytes per sample, a
guess follows, and fake steps at the guess confirm it (or shrink it) within the plan's usable memory,
less `HEADROOM`. Then, on CUDA and for layouts where every rank holds the whole model (none, ddp),
trial steps at that size: an out-of-memory error on any rank shrinks the micro-batch on every rank
(the verdict is all-reduced), so the ranks never disagree on the batch.

`batch_size=auto` is also the optimisation's batch, so memory alone does not decide it: the global
batch is capped at the larger of the default batch (64) and 1/`MIN_STEPS_PER_EPOCH` of the training
split. A small data set keeps the default's steps per epoch (memory that would take the whole split
in one step would turn 20 epochs into 20 steps), a large one gets the batch its memory allows. One
line says the batch, why, and the steps per epoch it leads to.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sized
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from gputrain.distributed.ac import ACMode
from gputrain.distributed.parallel_dims import Strategy
from gputrain.plan.layouts import usable_bytes
from gputrain.plan.measure import LossOf
from gputrain.plan.planner import PlanTarget, layout_row

if TYPE_CHECKING:
    from gputrain.config.schema import Config

log = logging.getLogger("gputrain")
HEADROOM = 0.9
"""Of the plan's usable memory, what the found micro-batch may fill (the rest absorbs what varies:
sequence lengths, the allocator's fragmentation)."""
SHRINK = 0.8
MAX_MICRO_BATCH = 1 << 16
MIN_STEPS_PER_EPOCH = 64
"""batch_size=auto's global batch is at most 1/64 of the training split (or the default batch, if
larger): the batch is a hyperparameter (learning rate and steps depend on it), so auto grows it
only where the data is large enough that an epoch is still many steps. Lightning's batch-size
finder would take the whole split; HF's auto_find_batch_size never grows the batch at all."""


def planned_bytes(target: PlanTarget, micro: int, world: int, device_bytes: int, strategy: Strategy, ac: ACMode) -> int:
    """The layout's planned bytes per device at `micro` samples."""
    return layout_row(target, micro, world, strategy, ac, False, device_bytes)[0].layout.total


def plan_micro_batch(
    target: PlanTarget,
    world: int,
    device_bytes: int,
    strategy: Strategy,
    ac: ACMode = "none",
    cap: int = MAX_MICRO_BATCH,
) -> int:
    """The largest micro-batch whose planned bytes fit `HEADROOM` of the usable memory; 0 if even one
    sample does not."""
    budget = usable_bytes(device_bytes) * HEADROOM

    def total(micro: int) -> int:
        return planned_bytes(target, micro, world, device_bytes, strategy, ac)

    one = total(1)
    if one > budget:
        return 0
    per_sample = total(2) - one
    if per_sample <= 0:
        return cap
    micro = min(cap, 1 + int((budget - one) / per_sample))
    if micro >= 16:
        micro -= micro % 8  # whole tiles of 8 for the matmuls
    for _ in range(8):  # the guess is linear; the measurement decides
        if micro <= 2 or total(micro) <= budget:
            return micro
        micro = max(2, int(micro * SHRINK))
    return micro


def agree(ok: bool) -> bool:
    """True when every rank's `ok` is (an out-of-memory error on any rank counts for all)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flag = torch.tensor([0 if ok else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


def confirm_by_trials(
    start: int, trial: Callable[[int], bool], agree: Callable[[bool], bool] = agree, max_tries: int = 12
) -> int:
    """The largest micro-batch from `start` down (by `SHRINK`) at which `trial` passes on every rank;
    0 when even 1 fails.

    Args:
        trial: runs a step at a micro-batch, False on out-of-memory (it frees what it made).
        agree: combines the ranks' verdicts; every rank must call it the same number of times.
    """
    micro = start
    for _ in range(max_tries):
        if agree(trial(micro)):
            return micro
        if micro == 1:
            return 0
        micro = max(1, int(micro * SHRINK))
    return 0


def oom_trial(step: Callable[[int], None]) -> Callable[[int], bool]:
    """`step(micro)` as a trial: False where it runs out of device memory (the cache is emptied)."""

    def trial(micro: int) -> bool:
        try:
            step(micro)
            return True
        except torch.OutOfMemoryError:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return False

    return trial


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _cuda_trial(target: PlanTarget, ac: ACMode) -> Callable[[int], bool]:
    """A real step on the device that changes nothing: forward, backward, and optimizer-state-sized
    tensors held across it; gradients dropped and buffers (BatchNorm statistics) restored after."""
    from gputrain.distributed.ac import apply_ac
    from gputrain.plan.measure import fake_copy, repeat_sample

    # a twin allocated on the device: the run's own model stays as it is (on meta until it is
    # materialised, or unwrapped); its values are copied there straight, with no second host copy,
    # and a meta model's uninitialised values do as well for a trial that measures memory
    source = target.model
    model = fake_copy(source, target.device)
    with torch.no_grad():
        for dst, src in zip([*model.parameters(), *model.buffers()], [*source.parameters(), *source.buffers()]):
            if not src.is_meta:
                dst.copy_(src)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    sample = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to(target.device), target.sample)
    checkpointed = apply_ac(model, ac) if ac != "none" else model

    def step(micro: int) -> None:
        states = [torch.empty_like(p) for p in model.parameters() for _ in range(target.optimizer_states)]
        try:
            with target.autocast():
                loss = target.loss_of(checkpointed, repeat_sample(sample, micro))
            loss.backward()
            torch.cuda.synchronize(target.device)
        finally:
            del states
            for p in model.parameters():
                p.grad = None
            with torch.no_grad():
                for name, b in model.named_buffers():
                    b.copy_(buffers[name])

    return oom_trial(step)


def resolve_auto_batch(
    config: Config,
    model: torch.nn.Module,
    train_data: Any,
    world: int,
    device: torch.device,
    precision: str,
    loss_of: LossOf | None = None,
) -> Config:
    """`config` with `auto` in train.batch_size or train.micro_batch_size replaced by the micro-batch
    that fits (a new Config: the run directory's config.toml records what ran); `config` itself
    where neither is auto. Rank 0 prints the line that says what was chosen.

    batch_size=auto: the global batch is that micro-batch × data-parallel ranks × grad_accum.
    micro_batch_size=auto (batch_size fixed): the largest divisor of the per-rank batch that fits;
    grad_accum makes up the rest.

    Args:
        loss_of: the step's loss, where the caller knows the task; else `surrogate_loss`
            (cross-entropy's memory).

    Raises:
        ConfigError: not even one sample fits (with the numbers), or the data has no sample to measure.
    """
    from gputrain.data.pixels import as_model_sees_it
    from gputrain.distributed.auto import device_memory
    from gputrain.errors import ConfigError
    from gputrain.plan.targets import build_target, data_parallel_ranks, surrogate_loss

    train = config.train
    if train.batch_size != "auto" and train.micro_batch_size != "auto":
        return config
    field = "train.batch_size" if train.batch_size == "auto" else "train.micro_batch_size"
    sample = _first_sample(train_data)
    if sample is None:
        raise ConfigError(field, "auto needs a Dataset of (inputs, targets) to measure a step on", "auto")
    sample = (as_model_sees_it(sample[0]), *sample[1:])
    target = build_target(config, model, sample, device, precision, loss_of=loss_of or surrogate_loss)
    dp = data_parallel_ranks(config, world)
    given = config.parallel.strategy
    if given == "auto" or given == "tuned":  # tuned reaches here only as auto's fallback
        from gputrain.plan.planner import auto_candidates

        strategy = auto_candidates(world)[0][0]
    else:
        strategy = given
    ac: ACMode = config.parallel.activation_checkpointing
    device_bytes = device_memory(device).bytes
    samples = _num_samples(train_data)
    accum = train.grad_accum if isinstance(train.grad_accum, int) else 1
    cap = max(1, min(MAX_MICRO_BATCH, (samples or MAX_MICRO_BATCH) // dp))
    if train.batch_size != "auto":
        cap = max(1, train.batch_size // dp)
    micro = plan_micro_batch(target, world, device_bytes, strategy, ac, cap)
    fits, global_cap = micro, auto_batch_cap(samples)
    capped_at = max(1, global_cap // (dp * accum)) if train.batch_size == "auto" else fits
    micro = min(micro, capped_at)
    how = "the plan"
    if micro and device.type == "cuda" and strategy in ("none", "ddp"):
        micro, how = confirm_by_trials(micro, _cuda_trial(target, ac)), "the plan and trial steps"
    if micro == 0:
        one = planned_bytes(target, 1, world, device_bytes, strategy, ac)
        raise ConfigError(
            field,
            f"auto: not even 1 sample per device fits: {one / 2**30:.2f} GiB planned, "
            f"{usable_bytes(device_bytes) * HEADROOM / 2**30:.2f} GiB usable",
            "auto",
            hint="more ranks with parallel.strategy=fsdp, parallel.activation_checkpointing=full, or a smaller model",
        )
    if train.batch_size == "auto":
        batch_size = micro * dp * accum
        resolved = replace(
            train,
            batch_size=batch_size,
            grad_accum=accum,
            micro_batch_size=None if train.micro_batch_size is None else micro,
        )
        ranks = f"{dp} rank" + ("s" if dp > 1 else "")
        line = f"train.batch_size=auto: {batch_size} (micro-batch {micro} × {ranks} × grad_accum {accum}): " + _why(
            fits, micro, capped_at, how, global_cap, samples, batch_size
        )
    else:
        per_rank = train.batch_size // dp
        micro = _largest_divisor_at_most(per_rank, micro)
        resolved = replace(train, micro_batch_size=micro, grad_accum=per_rank // micro)
        line = (
            f"train.micro_batch_size=auto: {micro} per device (from {how}); "
            f"train.grad_accum={resolved.grad_accum} makes up the batch of {resolved.batch_size}"
        )
    if int(os.environ.get("RANK", "0")) == 0:
        print(line, flush=True)
    return replace(config, train=resolved)


def auto_batch_cap(samples: int | None) -> int:
    """The largest global batch `batch_size=auto` takes for a training split of `samples` (None: of
    no known length, where only memory limits it)."""
    from gputrain.config.schema import TrainConfig

    default = TrainConfig().batch_size
    assert isinstance(default, int)
    if samples is None:
        return MAX_MICRO_BATCH
    return max(1, min(samples, max(default, samples // MIN_STEPS_PER_EPOCH)))


def _why(fits: int, micro: int, capped_at: int, how: str, cap: int, samples: int | None, batch: int) -> str:
    """The rest of the batch_size=auto line: what decided the micro-batch, and the epoch it makes."""
    if capped_at < fits and micro == capped_at:
        why = (
            f"memory allows {fits} per device ({how}), but auto takes at most {cap}, the larger of the default "
            f"batch and 1/{MIN_STEPS_PER_EPOCH} of the training split, as the batch changes the optimisation "
            f"(set train.batch_size to choose it)"
        )
    elif samples is not None and batch >= samples:
        why = "the whole training split, smaller than the default batch"
    else:
        why = f"the most that fits each device ({how})"
    if samples is None:  # no length: no epoch to count
        return why
    steps, left = divmod(samples, batch)
    dropped = f" (the last {left} of each epoch's shuffled order are left out)" if left else ""
    return f"{why}; {steps} step{'s' if steps != 1 else ''} per epoch of {samples} samples{dropped}"


def _num_samples(data: Any) -> int | None:
    """The training split's samples; None for data with no length (an iterable)."""
    source = data.dataset if isinstance(data, torch.utils.data.DataLoader) else data
    try:
        return len(source) if isinstance(source, Sized) else None
    except TypeError:  # a __len__ that says there is no length
        return None


def _first_sample(data: Any) -> tuple[Any, ...] | None:
    try:
        sample = data.dataset[0] if isinstance(data, torch.utils.data.DataLoader) else data[0]
    except Exception:  # noqa: BLE001 - a data set of its own kind: auto cannot measure it
        return None
    if isinstance(sample, torch.Tensor):
        return (sample,)
    if isinstance(sample, (list, tuple)) and sample and all(isinstance(t, torch.Tensor) for t in sample):
        return tuple(sample)
    return None
