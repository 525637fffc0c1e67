"""The shapes of a run's JSON files as their readers use them (run/reader.py's `Shape`): each field a
reader takes, with the kind gputrain writes there. Where each is written: run/summary.py and
rl/trainer.py (summary.json), train/lr_find.py (lr_find.json), observe/profiler.py (profile.json),
run/files.py (env.json), run/left_memory.py (memory-rankN.json).
"""

from __future__ import annotations

from gputrain.run.reader import BOOL, FINITE, INT, NUMBER, OBJECT, POSITIVE, TEXT, Shape, list_of, mapping_of, optional

_NUM = optional(FINITE)
"""A figure gputrain writes finite, or null where it has none (a speed, a size, a time)."""
_METRIC = optional(NUMBER)
"""A loss or metric: NaN or infinite where the run diverged, as the run wrote it."""

TRAIN = Shape(
    {
        "loss": _METRIC,
        "samples_per_s": _NUM,
        "tokens_per_s": _NUM,
        "step_time_s": _NUM,
        "peak_memory_bytes": _NUM,  # the largest rank's peak (older summaries: rank 0's)
        "peak_memory_rank": optional(INT),
        "peak_memory_by_rank": optional(list_of(_NUM)),  # indexed by rank; null: that rank's is missing
        "peak_memory_by_rank_step": optional(list_of(optional(INT))),  # the step each was read at
        "flops_per_step": _NUM,
        "achieved_flops": _NUM,
        "mfu": _NUM,
        "mfu_formula": _NUM,
        "flops_per_step_formula": _NUM,
        "mfu_peak_source": optional(TEXT),
        "host_peak_rss_bytes": _NUM,
        "time_breakdown": optional(mapping_of(_NUM)),
        "nonfinite_steps": optional(INT),
        "compile": optional(TEXT),
    }
)
RL = Shape(
    {
        "env": optional(TEXT),
        "policy": optional(TEXT),
        "num_envs": optional(INT),
        "iterations": optional(INT),
        "env_steps": _NUM,
        "env_steps_per_s": _NUM,
        "episodes": _NUM,
        "episodic_return": _METRIC,
        "episodic_length": _NUM,
        "stop_at_return": _NUM,
        "solved": optional(BOOL),
    }
)
SUMMARY = Shape(
    {
        "status": TEXT,
        "device": optional(TEXT),
        "precision": optional(TEXT),
        "world_size": optional(INT),
        "layout": optional(TEXT),
        "global_step": INT,
        "epochs_completed": optional(INT),
        "wall_s": _NUM,
        "error": optional(TEXT),
        "stop_reason": optional(TEXT),
        "train": OBJECT,
        "val": mapping_of(_METRIC),
        "test": mapping_of(_METRIC),
        "best": OBJECT,
        "data": OBJECT,
        "rl": OBJECT,
    },
    nested={"train": TRAIN, "rl": RL},
)
"""summary.json: what report, the use commands (`--checkpoint final`'s step) and a continued run read."""

ENV_RUN = Shape(
    {
        "device": optional(TEXT),
        "precision": optional(TEXT),
        "world_size": optional(INT),
        "layout": optional(TEXT),
        "allocator": optional(TEXT),
    }
)
ENV = Shape({"run": OBJECT}, nested={"run": ENV_RUN})
"""env.json: the machine's facts (shown as they are) and the start's "run"."""

LR_FIND = Shape(
    {
        "lrs": list_of(POSITIVE),  # drawn on a log axis
        "losses": list_of(_NUM),
        "smoothed": list_of(_NUM),
        "suggested_lr": optional(POSITIVE),
        "rule": optional(TEXT),
        "rule_text": optional(TEXT),
        "other_rules": mapping_of(optional(POSITIVE)),
        "stopped": optional(TEXT),
        "start_lr": optional(POSITIVE),
        "end_lr": optional(POSITIVE),
        "steps": optional(INT),
        "steps_run": optional(INT),
        "batch_size": optional(INT),
        "grad_accum": optional(INT),
        "precision": optional(TEXT),
        "device": optional(TEXT),
        "world_size": optional(INT),
        "config": OBJECT,
    },
    required=("lrs", "losses", "smoothed"),
)
"""lr_find.json: the curve (its three lists, of one length: checked by the report) and what ran."""

TUNE_ROW = Shape(
    {
        "label": optional(TEXT),
        "status": TEXT,
        "reason": optional(TEXT),
        "samples_per_s": optional(_NUM),
        "tokens_per_s": optional(_NUM),
        "step_time_s": optional(_NUM),
        "compile_s": optional(_NUM),
        "peak_memory_by_rank": optional(list_of(optional(_NUM))),
        "wall_s": optional(_NUM),
        "overrides": optional(list_of(TEXT)),
    },
    required=("status",),
)
TUNE = Shape(
    {
        "candidates": list_of(OBJECT),
        "winner": optional(INT),
        "auto": optional(INT),
        "unit": optional(TEXT),
        "budget_s": optional(_NUM),
        "spent_s": optional(_NUM),
        "batch_size": optional(INT),
        "machine": optional(OBJECT),
        "machine_fingerprint": optional(TEXT),
        "config_fingerprint": optional(TEXT),
    },
    required=("candidates",),
    each={"candidates": TUNE_ROW},
)
"""tune.json: each candidate's row (its status required; its figures as measured) and the winner."""

FINDING = Shape({"bottleneck": optional(TEXT), "evidence": optional(TEXT), "change": optional(TEXT)})
OP = Shape({"name": optional(TEXT), "calls": optional(INT), "self_host_us": _NUM, "self_device_us": _NUM})
PROFILE = Shape(
    {
        "findings": list_of(OBJECT),
        "facts": OBJECT,
        "top_device_ops": list_of(OBJECT),
        "top_host_ops": list_of(OBJECT),
    },
    each={"findings": FINDING, "top_device_ops": OP, "top_host_ops": OP},
)
"""profile.json: the advisor's findings, the facts they rest on, the top ops."""

LEFT_MEMORY = Shape(
    {"rank": INT, "peak_memory_bytes": FINITE, "step": INT, "attempt": TEXT},
    required=("rank", "peak_memory_bytes", "step", "attempt"),
)
"""memory-rankN.json: a rank's peak memory at an ending it did not share with rank 0 (run/left_memory.py)."""
