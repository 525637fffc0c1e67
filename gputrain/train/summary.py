"""summary.json: the result of a run, in the shape DESIGN.md promises."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gputrain.observe.speed import device_peak_memory_bytes

if TYPE_CHECKING:
    from gputrain.train.trainer import Trainer


def build_summary(trainer: "Trainer", status: str, wall_s: float, test: dict[str, float]) -> dict[str, Any]:
    state = trainer.state
    last_loss = getattr(trainer, "last_loss", None)
    train_time = state.train_time_s
    samples_per_s = state.samples_seen / train_time if train_time > 0 else None
    tokens_per_s = None
    if trainer.task == "lm" and trainer.spec is not None and samples_per_s is not None:
        tokens_per_s = samples_per_s * trainer.spec.input_shape[0]
    return {
        "status": status,
        "device": str(trainer.device),
        "precision": trainer.precision_mode,
        "world_size": trainer.dist.world_size,
        "global_step": state.global_step,
        "epochs_completed": state.epoch,
        "wall_s": wall_s,
        "train": {
            "loss": None if last_loss is None else float(last_loss),
            "samples_per_s": samples_per_s,
            "tokens_per_s": tokens_per_s,
            "step_time_s": train_time / state.global_step if state.global_step else None,
            "peak_memory_bytes": device_peak_memory_bytes(trainer.device),
            # flops_per_step, achieved_flops, mfu, mfu_peak_source, time_breakdown (+ GPT formula, host RSS)
            **trainer.speed.summary_fields(state.global_step, train_time),
            "nonfinite_steps": state.nonfinite_steps,
        },
        "data": {"skipped_samples": state.skipped_samples},
        "val": getattr(trainer, "val_metrics", {}),
        "test": test,
        "best": {"metric": state.best_metric, "step": state.best_step},
    }
