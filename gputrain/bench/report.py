"""The report `gputrain bench` prints: the device measured and its figures.

Kept apart from the runners so the single-process runner and the all-reduce runner (which the
single-process one starts) both build it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gputrain.bench.cache import device_name, driver_version, machine_key
from gputrain.bench.result import BenchResult, Settings

__all__ = ["BenchReport", "describe_device"]


@dataclass
class BenchReport:
    """`--json` output: `{"device": {...}, "results": [...], "notes": [...]}`."""

    device: dict[str, Any]
    results: list[BenchResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "results": [r.to_dict() for r in self.results], "notes": self.notes}


def describe_device(device: torch.device, settings: Settings) -> dict[str, Any]:
    name = device_name(device)
    return {
        "type": device.type,
        "name": name,
        "driver": driver_version() if device.type == "cuda" else None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "mode": settings.mode,
        "key": machine_key(name),
    }
