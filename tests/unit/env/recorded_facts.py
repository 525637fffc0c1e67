"""Recorded facts for the checks.

`recorded/cpu_only_no_driver.json` was captured by `collect_env()` on the 2-core CPU test machine
(`driver.pci_gpus`, added later, as `collect_env()` reports it there: 0).
`recorded/h100_healthy.json` is hand-written in the shape NVML and torch report for one H100 SXM
(no GPU was available to record one); the test scenarios are edits of it, named after what
they change.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from gputrain.env.facts import EnvReport

RECORDED = Path(__file__).parent / "recorded"


def load_recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text())


def edited_facts(name: str = "h100_healthy", **edits: Any) -> EnvReport:
    """Recorded facts with dotted-path edits: `edited_facts(**{"gpus.0.mig_enabled": True})`."""
    data = copy.deepcopy(load_recorded(name))
    for dotted, value in edits.items():
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[leaf] = value
    return EnvReport.from_dict(data)
