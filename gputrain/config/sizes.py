"""What a config asks the machine to allocate, estimated from its values alone.

No torch and no model code here (the config is checked before either is imported), so these are
LOWER bounds from the sizes the config states: the layers between the widths it names, not the
input and output layers that the data decides. A config whose lower bound does not fit in the
memory one rank on this node can have (config/memory_limit.py) can never run (every rank builds the
whole model in host memory, in fp32, before placing it), so it is refused with the numbers instead
of failing at step 1 or waking the OOM killer.
What the data adds, activations and optimizer state are the trainer's estimate (`distributed/auto.py`).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gputrain.config.memory_limit import local_ranks, rank_memory_limit
from gputrain.config.presets import gpt_size
from gputrain.config.schema import Config
from gputrain.errors import ConfigError, UsageError

__all__ = [
    "Demand",
    "check_fits_in_memory",
    "check_training_state_fits",
    "data_demand",
    "in_unit_of",
    "model_demand",
]

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


SKIP_MEMORY_CHECK_ENV = "GPUTRAIN_SKIP_MEMORY_CHECK"
"""Set to 1 to try a model that the memory checks say cannot fit (the estimate's own risk: an
allocation that fails is then recorded as the run's failure)."""


def memory_check_skipped() -> bool:
    return os.environ.get(SKIP_MEMORY_CHECK_ENV, "") not in ("", "0")


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


def in_unit_of(*sizes: float) -> Callable[[float], str]:
    """A formatter for the sizes of one message, in the unit of the largest (GiB, MiB or KiB): a small
    model under a tight limit read "0.0 GiB of weights ... has 0.0 GiB"."""
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20)) if max(sizes) >= s), ("KiB", 2**10))

    def size(n: float) -> str:
        return f"{n / scale:,.1f} {unit}"

    return size


def check_fits_in_memory(config: Config, memory_bytes: int | None = None) -> None:
    """Refuse a model or synthetic data set that cannot fit in the memory one rank on this node can
    have (`rank_memory_limit`: every rank builds the model and generates the data in host memory).

    Raises:
        ConfigError: naming the field that sets the size, with the bytes asked and the bytes there are.
    """
    if memory_check_skipped():
        return
    limit = rank_memory_limit() if memory_bytes is None else None
    memory = memory_bytes if limit is None else limit.bytes
    if memory is None:  # nothing could be read
        return
    for demand in (model_demand(config), data_demand(config)):
        if demand is not None and demand.bytes > memory:
            size = in_unit_of(demand.bytes, memory)
            has = (
                f"one rank can have {size(memory)} ({limit.what})"
                if limit is not None
                else f"this machine has {size(memory)} of memory"
            )
            raise ConfigError(
                demand.field,
                f"asks for {demand.what}: {size(demand.bytes)} or more, but {has}",
                demand.value,
                hint=f"use a smaller {demand.field} (or set {SKIP_MEMORY_CHECK_ENV}=1 to try anyway)",
            )


def training_state_bytes(parameters: Iterable[Any], states_per_param: int) -> tuple[int, int, int, int]:
    """(parameters, weight bytes, gradient bytes, optimizer-state bytes) of the model's parameters
    (tensors, real or on the meta device): what training holds before any activation.
    `states_per_param`: tensors of optimizer state per trained parameter (optim/states.py)."""
    count = weights = grads = 0
    for p in parameters:
        size = p.numel() * p.element_size()
        count += p.numel()
        weights += size
        grads += size if p.requires_grad else 0
    return count, weights, grads, grads * states_per_param


def state_memory(device: Any, offload: bool = False) -> tuple[tuple[int, str] | None, str]:
    """((bytes, what binds them), the place's name) of the memory that holds a rank's training state:
    the GPU's (a CUDA device), else this rank's part of host memory (parallel.cpu_offload keeps the
    state there too): `rank_memory_limit`, which divides what the ranks of a node share and not
    what each process has of its own."""
    on_gpu = device.type == "cuda" and not offload
    limit = rank_memory_limit(device if on_gpu else None)
    where = str(device) if on_gpu else "the host" if local_ranks() == 1 else "each rank on the host"
    return (None if limit is None else (limit.bytes, limit.what)), where


def check_training_state_fits(
    config: Config,
    model: Any,
    states_per_param: int,
    shards: int,
    memory: tuple[int, str] | None,
    where: str,
    optimizer_name: str | None = None,
) -> None:
    """Refuse, before the model is materialised, a model whose weights, gradients and optimizer state
    (`states_per_param` tensors the size of each trained parameter) alone (its parameters, real or
    on the meta device, split over `shards` ranks) exceed the memory (`memory`: bytes and what bounds
    them) of the device that holds them (`where`): it could only fail while building or at step 1.
    `optimizer_name`: the optimizer whose state it is, where not the config's (a user's own).

    Raises:
        UsageError: naming the sizes, the limit and what to change (ConfigError naming the field that
            sets the model's size, for a model of gputrain's own families).
    """
    if memory is None or memory_check_skipped():
        return
    cfg = config.optim
    count, weights, grads, state = training_state_bytes(model.parameters(), states_per_param)
    per_rank = (weights + grads + state) / max(1, shards)
    if per_rank <= memory[0]:
        return
    split = f" over {shards} ranks" if shards > 1 else ""
    size = in_unit_of(per_rank, memory[0])
    problem = (
        f"the model's {_params(count)} parameters need {size(weights)} of weights, {size(grads)} of gradients and "
        f"{size(state)} of {optimizer_name or cfg.name} state = {size(per_rank)} per rank{split}, before any "
        "activation, but "
        f"{where} has {size(memory[0])} ({memory[1]})"
    )
    # the field that sizes it, where the config built it (a model of the user's ignores model.*)
    demand = model_demand(config) if type(model).__module__.startswith("gputrain.models.") else None
    smaller = f"a smaller {demand.field}" if demand is not None else "a smaller model"
    hint = (
        f"use {smaller}, parallel.strategy=fsdp over more ranks (each holds 1/N of it), or set "
        f"{SKIP_MEMORY_CHECK_ENV}=1 to try anyway"
    )
    if demand is not None:
        raise ConfigError(demand.field, problem, demand.value, hint=hint)
    raise UsageError(f"{problem}; {hint}")
