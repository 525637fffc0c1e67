"""Which tokenizer a run's token ids mean, from its config and data: the data's own (data.tokenizer,
a prepared folder's: `DataBundle.tokenizer`), else, for model.name=hf, the tokenizer.json of the
local model directory the model is loaded from (model.hf_config: the folder, or the folder of its
config.json), the model's own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gputrain.text.tokenizer import HF_FILE, Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from gputrain.config import Config
    from gputrain.data.registry import DataBundle


def tokenizer_for(config: Config, bundle: DataBundle) -> Tokenizer | None:
    """The run's tokenizer, or None where neither its data nor its model has one.

    Raises:
        DataError: the model directory's tokenizer.json is not a tokenizer.
    """
    if bundle.tokenizer is not None:
        return bundle.tokenizer
    if config.model.name == "hf" and config.model.hf_config and bundle.spec.task == "lm":
        given = Path(config.model.hf_config).expanduser()
        folder = given if given.is_dir() else given.parent  # a config.json's own model directory
        if (folder / HF_FILE).exists():
            return load_tokenizer(folder)
    return None
