"""What a tune is for: the machine (device kind and name, how many, torch's version, the cores and
threads) and the config (every resolved field that changes a step's speed or memory).

The config's fingerprint leaves out what tune itself chooses (`TUNED`: the layout, micro-batch and
accumulation, compile, CUDA graphs, threads, loader workers) and what a step never sees (`IGNORED`:
where and how often the run logs, checkpoints and validates, how long it trains, its seed). So
`gputrain train parallel.strategy=tuned` with the tuned config applies its winner, and one that
changes the model, the data, the batch, the precision or the optimizer does not (`changed_fields`
names what did).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gputrain.config.schema import Config

TUNED = (
    "parallel.",
    "train.micro_batch_size",
    "train.grad_accum",
    "train.compile",
    "train.cuda_graphs",
    "train.num_threads",
    "data.num_workers",
)
IGNORED = (
    "log.",
    "checkpoint.",
    "eval.",
    "rl.",
    "train.epochs",
    "train.max_steps",
    "train.max_time",
    "train.smoke_steps",
    "train.limit_batches",
    "train.seed",
)


def _left_out(key: str) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) for p in (*TUNED, *IGNORED))


def config_fields(config: Config) -> dict[str, Any]:
    """The resolved fields the fingerprint covers, flat (section.key → value as config.toml has it)."""
    from gputrain.config.load import config_to_dict

    return {
        f"{section}.{key}": value
        for section, values in config_to_dict(config).items()
        for key, value in values.items()
        if not _left_out(f"{section}.{key}")
    }


def digest(fields: dict[str, Any]) -> str:
    text = json.dumps(fields, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def changed_fields(tuned: dict[str, Any], now: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(tuned) | set(now) if tuned.get(k) != now.get(k))


def machine(device_type: str) -> dict[str, Any]:
    """The machine's facts a tune's figures hold for."""
    import torch

    from gputrain.bench.cache import _cpu_model

    cuda = device_type == "cuda"
    return {
        "device": device_type,
        "name": torch.cuda.get_device_name(0) if cuda else _cpu_model(),
        "count": torch.cuda.device_count() if cuda else 1,
        "torch": torch.__version__,
        "cores": usable_cores(),
        "threads": os.cpu_count() or 1,
    }


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
