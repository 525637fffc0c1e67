"""Data registry: `name -> builder(data_config, seed) -> DataBundle`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from torch.utils.data import Dataset

from gputrain.config.schema import DataConfig
from gputrain.data.spec import DataSpec


@dataclass(slots=True)
class DataBundle:
    """The splits of one data source and what models need to know about it."""

    train: Dataset
    val: Dataset | None
    test: Dataset | None
    spec: DataSpec


DataBuilder = Callable[[DataConfig, int], DataBundle]
_SOURCES: dict[str, DataBuilder] = {}
_SOURCE_MODULES = ["gputrain.data.digits", "gputrain.data.csv_table", "gputrain.data.synthetic", "gputrain.data.mnist",
                   "gputrain.data.image_folder", "gputrain.data.text", "gputrain.data.tokens"]


def register_data(name: str) -> Callable[[DataBuilder], DataBuilder]:
    def decorate(builder: DataBuilder) -> DataBuilder:
        _SOURCES[name] = builder
        return builder

    return decorate


def _load_sources() -> None:
    for module in _SOURCE_MODULES:
        importlib.import_module(module)


def available_data() -> list[str]:
    _load_sources()
    return sorted(_SOURCES)


def build_data(config: DataConfig, seed: int) -> DataBundle:
    _load_sources()
    return _SOURCES[config.name](config, seed)
