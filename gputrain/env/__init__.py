"""The doctor: facts about the machine (data) → checks (judgements) → rendering; device choice.

`collect_env()` is what every run records in `env.json`; `run_checks()` judges those facts.
"""

from __future__ import annotations

import json
from pathlib import Path

from gputrain.env.checks import Check, gpu_present, passed, run_checks
from gputrain.env.device import explain_cuda_unavailable, resolve_device
from gputrain.env.facts import EnvReport, collect_env
from gputrain.run.layout import ENV

__all__ = [
    "Check",
    "EnvReport",
    "collect_env",
    "explain_cuda_unavailable",
    "gpu_present",
    "passed",
    "resolve_device",
    "run_checks",
    "write_env_json",
]


def write_env_json(run_dir: str | Path) -> Path:
    """Record this machine's facts as `<run_dir>/env.json` and return its path."""
    path = Path(run_dir) / ENV
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(collect_env().to_dict(), indent=2) + "\n")
    return path
