"""Data registry: `name -> builder(data_config, seed) -> DataBundle`.

A built-in name is also listed in `gputrain.config.names.DATA_NAMES`, which the config validates
against without importing this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torch.utils.data import Dataset

from gputrain.config.names import add_choice
from gputrain.config.schema import DataConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import DataError
from gputrain.registry import Registry

if TYPE_CHECKING:
    from gputrain.text.tokenizer import Tokenizer


@dataclass(slots=True)
class DataBundle:
    """The splits of one data source and what models need to know about it."""

    train: Dataset
    val: Dataset | None
    test: Dataset | None
    spec: DataSpec
    tokenizer: Tokenizer | None = None
    """The tokenizer the token ids mean, where the source knows it (data.tokenizer, a prepared
    folder's): the run keeps it, and generate, evaluate and export speak text with it."""
    tokenizer_hash: str | None = None
    """Its hash ("sha256:..."), as a prepared folder's manifest records it."""


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


def _brings_its_vocabulary(config: DataConfig) -> bool:
    """A prepared folder's manifest says its vocabulary (and checks data.tokenizer against its own)."""
    from gputrain.data.prepared import MANIFEST, is_prepared

    path = Path(config.path) if config.path is not None else None
    return config.name == "tokens" and path is not None and (is_prepared(path) or path.name == MANIFEST)


def build_data(config: DataConfig, seed: int) -> DataBundle:
    """The source's splits. With data.tokenizer, the tokenizer is loaded first: it sizes the
    vocabulary where data.vocab_size is unset, and is the bundle's unless the source set its own.

    Raises:
        UsageError: from the source; a tokenizer that is not one, or whose ids the model could not embed.
    """
    given = None
    if config.tokenizer is not None:
        from gputrain.text.tokenizer import load_tokenizer

        given = load_tokenizer(config.tokenizer)
        if config.vocab_size is None and not _brings_its_vocabulary(config):
            config = dataclasses.replace(config, vocab_size=given.vocab_size)
    bundle = SOURCES[config.name](config, seed)
    if given is None:
        return bundle
    vocab = bundle.spec.vocab_size
    if vocab is None:
        raise DataError(
            f"data.tokenizer: data.name={config.name} gives the model no token ids, so a tokenizer has nothing to "
            "mean; leave data.tokenizer unset"
        )
    if given.vocab_size > vocab:
        raise DataError(
            f"data.tokenizer {config.tokenizer}: {given.vocab_size} tokens, but data.vocab_size = {vocab}: the model "
            f"could not embed ids {vocab}..{given.vocab_size - 1}; raise data.vocab_size (or leave it unset)"
        )
    return bundle if bundle.tokenizer is not None else dataclasses.replace(bundle, tokenizer=given)
