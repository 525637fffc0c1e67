"""Recorded facts for the checks.

`cpu_only_no_driver.json` was captured by `collect_env()` on the 2-core CPU test machine.
`h100_healthy.json` is hand-written in the shape NVML and torch report for one H100 SXM (no GPU
was available to record one); the other scenarios are edits of it, named after what they change.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gputrain.env.facts import EnvReport

RECORDED = Path(__file__).parent / "recorded"


def load_recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


@pytest.fixture
def facts() -> Callable[..., EnvReport]:
    """`facts("h100_healthy", **{"driver.driver_cuda_version": "11.4"})`: recorded facts, edited."""

    def build(name: str = "h100_healthy", **edits: Any) -> EnvReport:
        data = copy.deepcopy(load_recorded(name))
        for dotted, value in edits.items():
            *parents, leaf = dotted.split(".")
            node = data
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            node[leaf] = value
        return EnvReport.from_dict(data)

    return build
