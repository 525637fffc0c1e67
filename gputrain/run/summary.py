"""summary.json: the result of a run, from the parts' own figures. Its shape is a promise to users (the
README's run directory section): status, device, precision, world_size, global_step, epochs_completed,
wall_s, a "train" block of speed figures and "val"/"test" blocks of metrics; keys are added, never
renamed or dropped. Its peak memory is every rank's: `peak_memory_bytes` the largest (one process's
own peak, as it always was), `peak_memory_by_rank` each rank's. record.py writes it, however the run ends."""

from __future__ import annotations

from typing import Any

import torch

from gputrain.observe.rank_memory import SUMMARY_FIELDS as MEMORY_FIELDS
from gputrain.observe.speed import SPEED_FIELDS, SpeedMeter
from gputrain.train.state import LoopState


def build_summary(
    status: str,
    wall_s: float,
    *,
    device: torch.device | None,
    precision: str | None,
    world_size: int,
    state: LoopState,
    speed: SpeedMeter | None,
    train_loss: float | None,
    tokens_per_sample: int | None,
    val: dict[str, float],
    test: dict[str, float],
    error: str | None = None,
    eval_skipped: dict[str, int] | None = None,
    compile: str | None = None,
) -> dict[str, Any]:
    """The run's summary. `status`: completed, stopped_early, interrupted or failed (then `error`
    says at which step and why). `compile`: what became of train.compile (compile_check.py). A run
    that failed before its parts were built has no device, precision or meter: those are null, and
    every key is still there."""
    train_time = state.train_time_s
    samples_per_s = state.samples_seen / train_time if train_time > 0 else None
    # flops_per_step, achieved_flops, mfu, mfu_peak_source, time_breakdown (+ GPT formula, host RSS)
    speed_fields = speed.summary_fields(state.global_step, train_time) if speed else dict.fromkeys(SPEED_FIELDS)
    # the largest rank's peak, the rank, and each rank's (observe/rank_memory.py: which were gathered when)
    memory = speed.memory.summary_fields(state.global_step) if speed else dict.fromkeys(MEMORY_FIELDS)
    summary: dict[str, Any] = {
        "status": status,
        "device": str(device) if device is not None else None,
        "precision": precision,
        "world_size": world_size,
        "global_step": state.global_step,
        "epochs_completed": state.epoch,
        "wall_s": wall_s,
        "train": {
            "loss": train_loss,
            "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * tokens_per_sample if samples_per_s and tokens_per_sample else None,
            "step_time_s": train_time / state.global_step if state.global_step else None,
            **memory,
            **speed_fields,
            "nonfinite_steps": state.nonfinite_steps,
            # train.compile: null when off; "compiled (...)", or "off: <why>" where compiled gradients were wrong
            "compile": compile,
        },
        # unreadable samples dropped (data.on_error=skip): in training, and per split in the last evaluation
        "data": {"skipped_samples": state.skipped_samples, "eval_skipped_samples": dict(eval_skipped or {})},
        "val": val,
        "test": test,
        "best": {"metric": state.best_metric, "step": state.best_step},
    }
    if error is not None:
        summary["error"] = error
    return summary


def start_up_summary(error: str, wall_s: float, world_size: int) -> dict[str, Any]:
    """summary.json of a run that failed before its parts were built: status failed, step 0, the error."""
    return build_summary(
        "failed",
        wall_s,
        device=None,
        precision=None,
        world_size=world_size,
        state=LoopState(),
        speed=None,
        train_loss=None,
        tokens_per_sample=None,
        val={},
        test={},
        error=error,
    )
