"""What a config asks the machine to allocate, estimated from its values alone.

No torch and no model code here (the config is checked before either is imported), so these are
LOWER bounds from the sizes the config states: the layers between the widths it names, not the
input and output layers that the data decides. A config whose lower bound does not fit in this
machine's memory can never run (every rank builds the whole model in host memory, in fp32, before
placing it), so it is refused with the numbers instead of failing at step 1 or waking the OOM killer.
What the data adds, activations and optimizer state are the trainer's estimate (`distributed/auto.py`).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path

from gputrain.config.presets import gpt_size
from gputrain.config.schema import Config
from gputrain.errors import ConfigError

__all__ = ["Demand", "check_fits_in_memory", "data_demand", "machine_memory_bytes", "model_demand"]

FP32_BYTES = 4
# Weights of the convolutions in the stages of gputrain's ResNets, per base_width² (the stem and
# the head depend on the data): fitted to the models in gputrain/models/resnet.py, exact for the
# quadratic part; tests/unit/config/test_sizes.py checks them against the built models.
RESNET_WEIGHTS_PER_WIDTH2 = {"resnet18": 2724, "resnet34": 5190, "resnet50": 5724}


@dataclass(frozen=True)
class Demand:
    """A lower bound of the bytes a config asks for, and the field to name when it is too many."""

    field: str
    value: object
    what: str
    """What is allocated, e.g. "a gpt of at least 1.2e10 parameters"."""
    bytes: int


def machine_memory_bytes() -> int | None:
    """Physical memory, or the container's memory limit where that is lower (cgroup v2 or v1)."""
    try:
        total: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = int(text)
            total = limit if total is None else min(total, limit)
    return total


def _params(count: float) -> str:
    return f"{count:.3g}" if count < 1e6 else f"{count / 1e6:.1f}M" if count < 1e9 else f"{count / 1e9:.1f}B"


def model_demand(config: Config) -> Demand | None:
    """The fp32 weights of the model the config describes (a lower bound), for the built-in families."""
    model = config.model
    field: str
    value: object
    if model.name == "mlp":
        widths = model.hidden_sizes
        count = sum(a * b + b for a, b in itertools.pairwise(widths))
        field, value = "model.hidden_sizes", model.hidden_sizes
    elif model.name == "cnn":
        channels = model.channels
        count = sum(9 * a * b + b for a, b in itertools.pairwise(channels)) + channels[-1] * model.hidden
        largest_conv = max((a * b for a, b in itertools.pairwise(channels)), default=0)
        field, value = (
            ("model.channels", model.channels)
            if 9 * largest_conv > channels[-1] * model.hidden
            else ("model.hidden", model.hidden)
        )
    elif model.name in RESNET_WEIGHTS_PER_WIDTH2:
        count = RESNET_WEIGHTS_PER_WIDTH2[model.name] * model.base_width**2
        field, value = "model.base_width", model.base_width
    elif model.name == "gpt":
        n_layer, d_model = gpt_size(model, "n_layer") or 0, gpt_size(model, "d_model") or 0
        context = gpt_size(model, "seq_len") or config.data.seq_len
        vocab = model.vocab_size or config.data.vocab_size or 0
        blocks, table = 12 * n_layer * d_model**2, (vocab + context) * d_model
        count = blocks + table
        if table > blocks and vocab >= context:
            field, value = ("model.vocab_size", vocab) if model.vocab_size else ("data.vocab_size", vocab)
        elif table > blocks:
            field, value = ("model.seq_len", context) if model.seq_len else ("data.seq_len", context)
        elif model.n_layer is not None and model.d_model is None:
            field, value = "model.n_layer", model.n_layer
        else:
            field, value = "model.d_model", d_model
    else:
        return None  # a family registered at run time: only its code knows its size
    return Demand(
        field, value, f"model.name={model.name} with at least {_params(count)} parameters", FP32_BYTES * count
    )


def data_demand(config: Config) -> Demand | None:
    """The tensors `data.name=synthetic` generates up front (the other sources read files)."""
    data = config.data
    if data.name != "synthetic":
        return None
    if data.task == "lm":
        # int64 windows and the random draws beside them: 16 bytes per token at least
        elements, per, what = data.num_samples * (data.seq_len + 1), 16, f"{data.seq_len + 1}-token windows"
    else:
        elements, per, what = (
            data.num_samples * math.prod(data.shape),
            FP32_BYTES,
            f"fp32 samples of shape {data.shape}",
        )
    return Demand("data.num_samples", data.num_samples, f"{data.num_samples} {what}", per * elements)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits_in_memory(config: Config, memory_bytes: int | None = None) -> None:
    """Refuse a model or synthetic data set that cannot fit in this machine's memory.

    Raises:
        ConfigError: naming the field that sets the size, with the bytes asked and the bytes there are.
    """
    memory = machine_memory_bytes() if memory_bytes is None else memory_bytes
    if not memory:
        return
    for demand in (model_demand(config), data_demand(config)):
        if demand is not None and demand.bytes > memory:
            raise ConfigError(
                demand.field,
                f"asks for {demand.what}: {_gib(demand.bytes)} or more, but this machine has {_gib(memory)} of memory",
                demand.value,
                hint=f"use a smaller {demand.field}",
            )
