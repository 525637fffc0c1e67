"""Data registry: `name -> builder(data_config, seed) -> DataBundle`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch.utils.data import Dataset

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


DataBuilder = Callable[[DataConfig, int], DataBundle]
SOURCES: Registry[DataBuilder] = Registry(
    ["gputrain.data.digits", "gputrain.data.csv_table", "gputrain.data.synthetic", "gputrain.data.mnist",
     "gputrain.data.image_folder", "gputrain.data.text", "gputrain.data.tokens"])
register_data = SOURCES.register


def available_data() -> list[str]:
    return SOURCES.names()


def build_data(config: DataConfig, seed: int) -> DataBundle:
    return SOURCES[config.name](config, seed)
