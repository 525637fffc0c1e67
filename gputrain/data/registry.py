"""Data registry: `name -> builder(data_config, seed) -> DataBundle`.

A built-in name is also listed in `gputrain.config.names.DATA_NAMES`, which the config validates
against without importing this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset

from gputrain.config.names import add_choice
from gputrain.config.schema import DataConfig
from gputrain.data.spec import DataSpec
from gputrain.registry import Registry


@dataclass(slots=True)
class DataBundle:
    """The splits of one data source and what models need to know about it."""

    train: Dataset
    val: Dataset | None
    test: Dataset | None
    spec: DataSpec
    tokenizer: Any = None
    """The tokenizer the token ids mean, where the source read text through one (issue 30's contract:
    gputrain.text.tokenizer.Tokenizer; typed loosely until that module is merged)."""


DataBuilder = Callable[[DataConfig, int], DataBundle]
SOURCES: Registry[DataBuilder] = Registry(
    [
        "gputrain.data.digits",
        "gputrain.data.csv_table",
        "gputrain.data.synthetic",
        "gputrain.data.mnist",
        "gputrain.data.image_folder",
        "gputrain.data.text",
        "gputrain.data.tokens",
        "gputrain.data.instructions",
        "gputrain.data.text_classes",
    ]
)


def register_data(name: str) -> Callable[[DataBuilder], DataBuilder]:
    """Decorator: add a data source under `name`; the config accepts `data.name=name` from now on."""
    add_choice("data.name", name)
    return SOURCES.register(name)


def available_data() -> list[str]:
    return SOURCES.names()


def build_data(config: DataConfig, seed: int) -> DataBundle:
    return SOURCES[config.name](config, seed)
