"""The loop's own state (counters, best metric) and every RNG, in checkpointable form."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gputrain.checkpoint.matching import CheckpointMismatch, first_difference, kind_of_value, listing
from gputrain.errors import RunError


@dataclass(slots=True)
class LoopState:
    global_step: int = 0
    """Optimizer steps taken."""
    epoch: int = 0
    """Current epoch (0-based)."""
    step_in_epoch: int = 0
    """Optimizer steps already taken in the current epoch: where the data resumes."""
    samples_seen: int = 0
    train_time_s: float = 0.0
    """Seconds spent in training steps (evaluation and checkpointing excluded)."""
    best_metric: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    nonfinite_steps: int = 0
    """Steps skipped because the loss or gradients were NaN/Inf (train.on_nonfinite=skip)."""
    skipped_samples: int = 0
    """Unreadable training samples dropped (data.on_error=skip)."""
    metrics_rows: int | None = None
    """The rows metrics.jsonl held when the checkpoint was taken (rank 0 writes it): a resume keeps
    exactly these, so a row logged after the checkpoint at its own step (the test evaluation, an
    evaluation after a periodic save) is not written twice. None: a checkpoint older than the count."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopState:
        return cls(**data)


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """Every RNG the training can draw from, as tensors and plain values (weights_only-loadable).

    On CUDA only the generator of `device`, the one this rank draws from: a checkpoint then
    resumes on a machine with fewer GPUs (torch's all-devices variant fails there)."""
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)  # ("MT19937", keys, pos, has_gauss, cached_gaussian)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": random.getstate(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def cuda_rng_for(saved: Any, device: torch.device) -> torch.Tensor:
    """The CUDA generator state to give `device`. Checkpoints before 2026-11 hold a list with
    one state per GPU the saving process saw; the entry of the same index is taken, or the
    last one where this machine numbers its GPUs higher than that one had."""
    if isinstance(saved, (list, tuple)):
        return saved[min(device.index or 0, len(saved) - 1)]
    return saved


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if state.get("cuda") is not None and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(cuda_rng_for(state["cuda"], device), device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class CheckedCheckpoint(dict[str, Any]):
    """A checkpoint's training state (state.pt), read and checked against this run's model and optimizer,
    whose weights and optimizer state are not applied yet: `restore_training_state` applies them once
    the rest of the state has been checked too (`Checkpointer.load` returns one)."""

    def __init__(self, state: dict[str, Any], apply_weights: Callable[[], None], step: int | None) -> None:
        super().__init__(state)
        self.apply_weights = apply_weights
        self.step = step
        """The step the checkpoint's marker names (its loop state must say the same)."""


_COUNTERS = (
    "global_step",
    "epoch",
    "step_in_epoch",
    "samples_seen",
    "evals_without_improvement",
    "nonfinite_steps",
    "skipped_samples",
)
# bookkeeping keys of torch's schedulers that come and go between torch versions
_SCHEDULER_OPTIONAL = {"verbose", "_get_lr_called_within_step", "_is_initial", "_step_count"}


def check_training_state(
    path: Path,
    saved: Mapping[str, Any],
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    precision: Any,
    step: int | None = None,
) -> None:
    """Raise CheckpointMismatch unless the checkpoint's training state fits this run: the LR
    scheduler's state has this run's scheduler's entries (of the same kinds), the loss scaler's state
    is one, the loop's counters are counters (and name the checkpoint's step), and every RNG state
    is one its generator accepts (tried on throwaway generators). Changes nothing."""
    lacking = [key for key in ("scheduler", "precision", "loop", "rng") if key not in saved]
    if lacking:
        raise CheckpointMismatch(path, f"state.pt lacks the {listing(lacking)} state")
    _check_scheduler(path, saved["scheduler"], scheduler)
    _check_precision(path, saved["precision"], precision)
    _check_loop(path, saved["loop"], step)
    rng = saved["rng"]
    if isinstance(rng, list):  # a sharded checkpoint: every rank's
        if not rng:
            raise CheckpointMismatch(path, "state.pt: the RNG state is an empty list")
        for i, entry in enumerate(rng):
            _check_rng(path, entry, f"the RNG state of rank {i}")
    else:
        _check_rng(path, rng, "the RNG state")


def _check_scheduler(path: Path, saved: Any, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    live = scheduler.state_dict()
    name = type(scheduler).__name__
    if not isinstance(saved, Mapping) or not all(isinstance(k, str) for k in saved):
        raise CheckpointMismatch(path, f"state.pt: the LR scheduler state is {kind_of_value(saved)}, not a dict")
    lacking = [k for k in live if k not in saved and k not in _SCHEDULER_OPTIONAL]
    extra = [k for k in saved if k not in live and k not in _SCHEDULER_OPTIONAL]
    if lacking or extra:
        parts = [f"lacks {listing(lacking)}" if lacking else "", f"has {listing(extra)}" if extra else ""]
        raise CheckpointMismatch(
            path,
            f"state.pt: the LR scheduler state is not this run's {name}'s: it "
            + " and ".join(p for p in parts if p)
            + " (another optim.schedule?)",
        )
    for key in live:
        if key in saved:
            found = first_difference(live[key], saved[key], f"the LR scheduler's {key}")
            if found:
                raise CheckpointMismatch(path, f"state.pt: {found}")


def _check_precision(path: Path, saved: Any, precision: Any) -> None:
    if not isinstance(saved, Mapping) or not all(isinstance(k, str) for k in saved):
        raise CheckpointMismatch(path, f"state.pt: the precision state is {kind_of_value(saved)}, not a dict")
    live = precision.state_dict()
    if not live or not saved:
        return  # no scaler here, or none saved (an fp32/bf16 run): nothing is loaded into one
    for key, value in live.items():
        if key not in saved:
            raise CheckpointMismatch(path, f"state.pt: the loss scaler's state lacks {key}")
        found = first_difference(value, saved[key], f"the loss scaler's {key}")
        if found:
            raise CheckpointMismatch(path, f"state.pt: {found}")


def _check_loop(path: Path, saved: Any, step: int | None) -> None:
    if not isinstance(saved, Mapping) or not all(isinstance(k, str) for k in saved):
        raise CheckpointMismatch(path, f"state.pt: the loop state is {kind_of_value(saved)}, not a dict")
    fields = set(LoopState.__dataclass_fields__)
    unknown = [k for k in saved if k not in fields]
    if unknown:
        raise CheckpointMismatch(path, f"state.pt: the loop state has {listing(unknown)}, which this gputrain lacks")
    for key in _COUNTERS:
        value = saved.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CheckpointMismatch(path, f"state.pt: loop.{key} is {value!r}, not a count")
    for key, optional in (("train_time_s", False), ("best_metric", True)):
        value = saved.get(key)
        if not (optional and value is None) and key in saved and not is_plain_number(value):
            raise CheckpointMismatch(path, f"state.pt: loop.{key} is {kind_of_value(value)}, not a number")
    rows = saved.get("metrics_rows")
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 0):
        raise CheckpointMismatch(path, f"state.pt: loop.metrics_rows is {rows!r}, not a count")
    best_step = saved.get("best_step")
    if best_step is not None and (not isinstance(best_step, int) or isinstance(best_step, bool) or best_step < 0):
        raise CheckpointMismatch(path, f"state.pt: loop.best_step is {best_step!r}, not a step")
    if not isinstance(saved.get("extra", {}), dict):
        raise CheckpointMismatch(path, f"state.pt: loop.extra is {kind_of_value(saved['extra'])}, not a dict")
    if step is not None and saved.get("global_step", 0) != step:
        raise CheckpointMismatch(
            path, f"state.pt: loop.global_step is {saved.get('global_step', 0)}, the checkpoint is of step {step}"
        )


def is_plain_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_rng(path: Path, saved: Any, what: str) -> None:
    """Each generator's state, tried on a throwaway generator of the same kind."""
    if not isinstance(saved, Mapping):
        raise CheckpointMismatch(path, f"state.pt: {what} is {kind_of_value(saved)}, not a dict")
    lacking = [k for k in ("torch", "numpy", "python") if k not in saved]
    if lacking:
        raise CheckpointMismatch(path, f"state.pt: {what} lacks {listing(lacking)}")
    state = saved["torch"]
    try:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
            raise TypeError(f"{kind_of_value(state)} rather than a byte tensor")
        torch.Generator().set_state(state)
    except (TypeError, ValueError, RuntimeError) as err:
        raise CheckpointMismatch(path, f"state.pt: {what}: torch's is not a generator state ({_short(err)})") from None
    try:
        np.random.RandomState().set_state(_numpy_state(saved["numpy"]))
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as err:
        raise CheckpointMismatch(path, f"state.pt: {what}: numpy's is not a generator state ({_short(err)})") from None
    try:
        version, internal, gauss = saved["python"]
        random.Random().setstate((version, tuple(internal), gauss))
    except (TypeError, ValueError, OverflowError) as err:
        raise CheckpointMismatch(path, f"state.pt: {what}: python's is not a generator state ({_short(err)})") from None
    cuda = saved.get("cuda")
    states = cuda if isinstance(cuda, (list, tuple)) else [cuda]
    if cuda is not None and not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in states):
        raise CheckpointMismatch(path, f"state.pt: {what}: the CUDA generator's is not a byte tensor")


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text[:100]


_MT_KEYS = 624  # the Mersenne Twister's state words


def _numpy_state(saved: Any) -> tuple[str, np.ndarray, int, int, float]:
    if not isinstance(saved, Mapping):
        raise TypeError(f"{kind_of_value(saved)} rather than a dict")
    keys = saved["keys"]
    if not isinstance(keys, torch.Tensor) or keys.dtype.is_floating_point or keys.dim() != 1:
        raise TypeError("its keys are not a tensor of integers")
    if keys.numel() != _MT_KEYS:  # numpy takes fewer and fails at the next draw
        raise ValueError(f"{keys.numel()} keys, not {_MT_KEYS}")
    for name in ("pos", "has_gauss"):
        if not isinstance(saved[name], int) or isinstance(saved[name], bool):
            raise TypeError(f"{name} is {kind_of_value(saved[name])}")
    if not 0 <= saved["pos"] <= _MT_KEYS or saved["has_gauss"] not in (0, 1):
        raise ValueError("its position is out of range")
    if not is_plain_number(saved["cached_gaussian"]):
        raise TypeError(f"cached_gaussian is {kind_of_value(saved['cached_gaussian'])}")
    if (keys < 0).any() or (keys >= 2**32).any():
        raise ValueError("a key is out of range")
    return ("MT19937", keys.numpy().astype(np.uint32), saved["pos"], saved["has_gauss"], saved["cached_gaussian"])


def restore_training_state(
    path: Path,
    saved: dict[str, Any],
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    precision: Any,
    rank: int,
    device: torch.device,
) -> LoopState:
    """Put the training state of the checkpoint at `path` back; returns the loop's state to continue
    from. Everything is checked first (`check_training_state`); only then are the weights and the
    optimizer state applied (where `saved` is a CheckedCheckpoint, from `Checkpointer.load`), then the
    schedule, the loss scale and every RNG. A sharded checkpoint holds every rank's RNG: each rank
    takes its own (the last one where this job has more ranks than the saving one had).

    Raises:
        CheckpointMismatch: the state is not this run's kind (a UsageError: exit code 2); nothing of the
            model, optimizer, scheduler, precision or RNGs was changed.
        RunError: applying it failed although it was checked.
    """
    check_training_state(path, saved, scheduler, precision, getattr(saved, "step", None))
    apply_weights = getattr(saved, "apply_weights", None)
    if apply_weights is not None:
        apply_weights()
    try:
        scheduler.load_state_dict(saved["scheduler"])
        precision.load_state_dict(saved["precision"])
        rng = saved["rng"]
        restore_rng(rng[min(rank, len(rng) - 1)] if isinstance(rng, list) else rng, device)
        return LoopState.from_dict(saved["loop"])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as err:
        raise RunError(
            f"cannot resume: {path}: restoring the training state failed although it was checked "
            f"({type(err).__name__}: {str(err)[:120]})"
        ) from None
