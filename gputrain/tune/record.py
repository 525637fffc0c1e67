"""tune.json: what `gputrain tune` measured, the winner, and what it holds for (fingerprint.py).

It goes into the tune's directory (`--run-dir`, default `runs/<model>-<data>-tune/`, where
`parallel.strategy=tuned` looks when `parallel.tune_file` is unset), the only file a tune writes
there; `gputrain report DIR` draws its table. A tune.json is replaced only by another tune
(run/output.py's marker).

    {"gputrain": "gputrain tune", "version", "created", "budget_s", "spent_s", "batch_size",
     "warmup_steps", "timed_steps", "unit": "samples/s" | "tokens/s",
     "machine": {device, name, count, torch, cores, threads}, "machine_fingerprint",
     "config_fields": {section.key: value}, "config_fingerprint",
     "candidates": [{candidate, label, overrides, status, reason, samples_per_s, tokens_per_s,
                     step_time_s, compile_s, peak_memory_by_rank, wall_s}],
     "winner": index | null, "auto": index | null}
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gputrain import __version__
from gputrain.run.layout import TUNE
from gputrain.tune.fingerprint import digest
from gputrain.tune.scheduler import Result, best

__all__ = ["TUNE", "default_tune_dir", "is_tune_record", "tune_record"]

TUNE_SUFFIX = "-tune"


def default_tune_dir(model: str, data: str) -> Path:
    """Where `gputrain tune` writes and `parallel.strategy=tuned` reads when nothing is named."""
    return Path("runs") / f"{model}-{data}{TUNE_SUFFIX}"


def tune_record(
    results: Sequence[Result],
    *,
    machine: dict[str, Any],
    fields: dict[str, Any],
    budget_s: float,
    spent_s: float,
    batch_size: int,
    warmup: int | None,
    timed: int | None,
) -> dict[str, Any]:
    from gputrain.run.output import marked

    winner = best(results)
    auto = next((i for i, r in enumerate(results) if r.candidate.strategy == "auto"), None)
    tokens = any(r.tokens_per_s is not None for r in results)
    return {
        **marked("tune"),
        "version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": budget_s,
        "spent_s": spent_s,
        "batch_size": batch_size,
        "warmup_steps": warmup,
        "timed_steps": timed,
        "unit": "tokens/s" if tokens else "samples/s",
        "machine": machine,
        "machine_fingerprint": digest(machine),
        "config_fields": fields,
        "config_fingerprint": digest(fields),
        "candidates": [r.as_dict() for r in results],
        "winner": None if winner is None else list(results).index(winner),
        "auto": auto,
    }


def is_tune_record(path: Path) -> bool:
    """A tune.json a tune wrote: the only one a tune replaces."""
    from gputrain.run.output import json_record

    return json_record("tune", "candidates", "winner", "config_fingerprint")(path)
