"""A run directory as a very long run leaves it, written directly (no training): every step
logged, a loss that falls with noise and a few spikes, a cosine learning rate, an evaluation now
and then. For the size bound: tests/unit/report/test_size.py, and `python -m
tests.unit.report.measure_size` for the published figures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from gputrain.config import config_to_toml, load_config

SPIKE_STEP, SPIKE_LOSS = 777, 42.0


def write_long_run(run_dir: Path, steps: int, every: int = 1) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.toml").write_text(config_to_toml(load_config(None, [f"train.max_steps={steps}"])))
    rng = np.random.default_rng(0)
    with (run_dir / "metrics.jsonl").open("w") as out:
        for step in range(every, steps + 1, every):
            loss = 2.3 * math.exp(-step / (steps / 6)) + 0.05 + 0.02 * float(rng.standard_normal()) ** 2
            row = {
                "step": step, "epoch": 1 + step // 1000, "loss": SPIKE_LOSS if step == SPIKE_STEP else loss,
                "lr": 1e-3 * 0.5 * (1 + math.cos(math.pi * step / steps)), "grad_norm": 1 + float(rng.random()),
                "samples_per_s": 20000 + 500 * float(rng.standard_normal()), "step_time_s": 0.003,
                "achieved_flops": 6e9, "mfu": 0.31, "peak_memory_bytes": 4.3e8,
            }
            if step % 25 == 0:
                row.update(time_data=0.05, time_h2d=0.01, time_forward_backward=0.5, time_optimizer=0.4,
                           time_comm=0.0, time_other=0.04)
            out.write(json.dumps(row) + "\n")
            if step % (steps // 20) == 0:
                out.write(json.dumps({"step": step, "epoch": 1 + step // 1000, "split": "val",
                                      "accuracy": 1 - loss / 3, "loss": loss}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({
        "status": "completed", "device": "cpu", "precision": "fp32", "world_size": 1, "global_step": steps,
        "epochs_completed": steps // 1000, "wall_s": steps * 0.003,
        "train": {"loss": 0.06, "samples_per_s": 20000.0, "step_time_s": 0.003, "mfu": 0.31,
                  "time_breakdown": {"data": 0.05, "h2d": 0.01, "forward_backward": 0.5, "optimizer": 0.4,
                                     "comm": 0.0, "other": 0.04}},
        "val": {"accuracy": 0.98, "loss": 0.06}, "test": {},
    }))
