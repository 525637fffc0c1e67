"""The loop's own state (counters, best metric) and every RNG, in checkpointable form."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

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


def training_state(
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    precision: Any,
    loop: LoopState,
    device: torch.device,
    task: str | None,
    num_classes: int | None,
) -> dict[str, Any]:
    """What a checkpoint holds besides the weights and the optimizer: the LR schedule's position,
    the loss scale, the loop's counters and every RNG (weights_only-loadable)."""
    return {
        "scheduler": scheduler.state_dict(),
        "precision": precision.state_dict(),
        "loop": loop.to_dict(),
        "rng": capture_rng(device),
        "task": task,
        "num_classes": num_classes,
    }


def restore_training_state(
    path: Path,
    saved: dict[str, Any],
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    precision: Any,
    rank: int,
    device: torch.device,
) -> LoopState:
    """Put the training state of the checkpoint at `path` back; returns the loop's state to continue
    from. A sharded checkpoint holds every rank's RNG: each rank takes its own (the last one where
    this job has more ranks than the saving one had).

    Raises:
        RunError: the state is not this run's kind (the bytes were verified, the content does not fit).
    """
    try:
        scheduler.load_state_dict(saved["scheduler"])
        precision.load_state_dict(saved["precision"])
        rng = saved["rng"]
        restore_rng(rng[min(rank, len(rng) - 1)] if isinstance(rng, list) else rng, device)
        return LoopState.from_dict(saved["loop"])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as err:
        raise RunError(
            f"cannot resume: {path}: state.pt does not hold this run's training state "
            f"({type(err).__name__}: {str(err)[:120]})"
        ) from None
