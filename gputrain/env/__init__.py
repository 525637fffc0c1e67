"""Facts about the machine (data) and the device choice. The doctor builds on these."""

from __future__ import annotations

import platform
import sys
from typing import Any

import torch

from gputrain.env.device import explain_cuda_unavailable, resolve_device

__all__ = ["collect_env", "explain_cuda_unavailable", "resolve_device"]


def collect_env() -> dict[str, Any]:
    """The facts a run records in env.json (serialisable data, no judgements)."""
    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            facts["gpus"].append({"index": i, "name": props.name, "memory_total": props.total_memory,
                                  "capability": f"{props.major}.{props.minor}"})
    return facts
