"""The training loop alone: the public `Trainer` (`trainer`), its parts built from a config
(`build`), one optimizer step (`step`: `train_step`, and `apply_update` that PPO shares), the
non-finite guard (`guard` picks it: `nonfinite` on the host, `device_guard` on the device), the
loop's state (`state`), tasks and losses (`tasks`), checkpoints (`checkpointer`), logged rows
(`metrics`), callbacks (`callbacks`: the protocol; `ema` and `stop_on_metric`: two of them), the
compile check (`compile_check`) and the LR finder (`lr_find`).

The shell every loop runs in is `gputrain.run.shell`; the run directory is `gputrain.run`,
evaluation `gputrain.evaluate`, feeding `gputrain.data.feed`. Names are imported on first use
(gputrain/lazy.py)."""

from __future__ import annotations

from gputrain.lazy import lazy_exports

_EXPORTS = {
    "Callback": "callbacks",
    "Callbacks": "callbacks",
    "EMA": "ema",
    "StopOnMetric": "stop_on_metric",
    "TrainingParts": "build",
    "build_training": "build",
    "Checkpointer": "checkpointer",
    "MetricsLogger": "metrics",
    "LoopState": "state",
    "StepParts": "step",
    "StepResult": "step",
    "train_step": "step",
    "apply_update": "step",
    "Trainer": "trainer",
}
__all__ = sorted(_EXPORTS)  # the names `from gputrain.<package> import *` gives
__getattr__ = lazy_exports(__name__, _EXPORTS)
