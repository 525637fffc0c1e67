"""New labelled data for `evaluate` (`data.path=...` on its command line), read whole as raw samples
of the run's data source and labelled with the run's classes, vocabulary or token range (a prepared
folder of token shards is streamed from its shards instead: its val split, else its train split; text
classes and instructions through the run's data.tokenizer).

The run's preprocessing (its training split's statistics, not the new file's) is applied to them
batch by batch on the device, and the targets keep the model's class order: a new CSV file that
lacks a class, or an image folder with fewer class folders, is scored against the model's classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from gputrain.config.schema import DataConfig
from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError, DataError, UsageError
from gputrain.use.generate import Tokenizer
from gputrain.use.held_out import evenly_spaced
from gputrain.use.preprocess import Preprocessing
from gputrain.use.tables import read_rows

if TYPE_CHECKING:
    from gputrain.text.tokenizer import Tokenizer as TextTokenizer

NEW_DATA_KEYS = ("data.path", "data.val_path")
"""The overrides that name new data rather than change how the run's own data is built."""


@dataclass(frozen=True, slots=True)
class TextSize:
    """Text read through a tokenizer: its tokens and its UTF-8 bytes (for bits per byte)."""

    tokens: int
    bytes: int


_LM_SOURCES = ("tokens",)
"""Sources of token ids whose new data may be plain text, read through the run's tokenizer into
windows (instructions and text classes read their own records through it)."""


def read_new_data(
    pre: Preprocessing, data: DataConfig, tokenizer: TextTokenizer | None = None
) -> tuple[Dataset, TextSize | None]:
    """The labelled samples at `data.path` (tokens: `data.val_path` where given), raw; with the
    text's size where it was text read through the run's `tokenizer` (a token-id run's data.path
    that is not a .bin file is UTF-8 text where the run keeps its tokenizer).

    Raises:
        UsageError (DataError): the source reads no files, or the data does not match the model
            (columns, classes, characters, token ids), naming the file and what the model expects.
    """
    source = pre.source
    path = Path(data.val_path if source == "tokens" and data.val_path else data.path or "")
    readers = {
        "csv": _csv,
        "image_folder": _image_folder,
        "mnist": _mnist,
        "text": _text,
        "tokens": _tokens,
        "instructions": _instructions,
        "text_classes": _text_classes,
    }
    if source not in readers:
        raise UsageError(
            f"data.name={source} reads no data files: evaluate one of its splits with --split (train, val, test)"
        )
    if not path.exists():
        raise DataError(f"data.path: no such file or folder: {path}")
    if tokenizer is not None and source in _LM_SOURCES and path.suffix != ".bin" and not path.is_dir():
        windows, size = _tokenized_text(tokenizer, path, pre.input_shape[0])
        return _capped(windows, data.max_eval_samples), size
    return _capped(readers[source](pre, path, data), data.max_eval_samples), None


def _tokenized_text(tokenizer: TextTokenizer, path: Path, seq_len: int) -> tuple[TensorData, TextSize]:
    from gputrain.data.text import read_text

    text = read_text(path)  # its refusals name the file already
    ids = tokenizer.encode(text)
    windows = _windows(torch.tensor(ids, dtype=torch.long), seq_len, path)
    return windows, TextSize(len(ids), len(text.encode("utf-8")))


def _csv(pre: Preprocessing, path: Path, data: DataConfig) -> Dataset:
    assert pre.table is not None
    _, features, targets = read_rows(path, pre.table, need_labels=True)
    assert targets is not None
    return TensorData(features, targets)


def _image_folder(pre: Preprocessing, path: Path, data: DataConfig) -> Dataset:
    from gputrain.data.image_folder import ImageFolderData, scan_classes

    assert pre.class_names is not None
    # class folders by name: a folder the model has no class for is refused, naming the classes
    _, files, labels = scan_classes(path, list(pre.class_names))
    _, height, width = pre.input_shape  # [channels, height, width]
    return ImageFolderData(files, labels, (height, width))


def _mnist(pre: Preprocessing, path: Path, data: DataConfig) -> Dataset:
    from gputrain.data.mnist import load_split

    images, labels = load_split(path, "test_images", "test_labels")
    if images.shape[1:] != pre.input_shape:
        raise DataError(f"{path}: images of {list(images.shape[1:])}; the model reads {list(pre.input_shape)}")
    num_classes = len(pre.class_names or ())
    if len(labels) and int(labels.max()) >= num_classes:
        raise DataError(f"{path}: label {int(labels.max())}; the model knows the classes 0..{num_classes - 1}")
    return TensorData(images, labels)


def _text(pre: Preprocessing, path: Path, data: DataConfig) -> Dataset:
    from gputrain.data.text import read_text

    text = read_text(path)  # its refusals name the file already
    try:
        ids = Tokenizer.of(pre).encode(text)
    except UsageError as err:  # the tokenizer speaks of --prompt
        raise DataError(f"{path}: {str(err).removeprefix('--prompt: ')}") from None
    return _windows(torch.tensor(ids, dtype=torch.long), pre.input_shape[0], path)


def _tokens(pre: Preprocessing, path: Path, data: DataConfig) -> Dataset:
    from gputrain.data.prepared import MANIFEST, is_prepared
    from gputrain.data.tokens import check_vocab, check_width, count_tokens

    folder = path.parent if path.name == MANIFEST and path.is_file() else path
    if is_prepared(folder):
        return _prepared_tokens(pre, folder)
    if path.is_dir():
        raise DataError(f"{path}: a folder; give the token file (flat uint16 ids) with data.path=FILE.bin")
    count_tokens(path, pre.input_shape[0])
    check_width(path)
    assert pre.vocab_size is not None
    try:
        check_vocab(path, pre.vocab_size)
    except DataError as err:  # its advice is about data.vocab_size, which the trained model fixes
        raise DataError(f"{str(err).split('; set data.vocab_size')[0]}; the model's vocabulary is fixed") from None
    ids = torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))
    return _windows(ids, pre.input_shape[0], path)


def _prepared_tokens(pre: Preprocessing, folder: Path) -> Dataset:
    """A prepared folder's val split (its train split where it has none), streamed from its shards
    as training reads them, its ids checked against the model's fixed vocabulary."""
    from gputrain.data.prepared import read_prepared
    from gputrain.data.tokens import TokenWindows, largest_in

    prepared = read_prepared(folder)  # its refusals name the manifest or the shard
    split = "val" if "val" in prepared.splits else "train"
    stream, seq_len = prepared.splits[split], pre.input_shape[0]
    count = (len(stream) - 1) // seq_len
    if count < 1:
        raise DataError(
            f"{folder}: {split} split: {len(stream)} tokens, fewer than one window of data.seq_len + 1 = {seq_len + 1}"
        )
    assert pre.vocab_size is not None
    largest, file = largest_in(stream)
    if largest >= pre.vocab_size:
        raise DataError(
            f"{file}: holds token id {largest}, but the model's vocabulary is 0..{pre.vocab_size - 1}; the model's "
            "vocabulary is fixed"
        )
    return TokenWindows(stream, seq_len, 0, count, vocab_size=pre.vocab_size)


def _instructions(pre: Preprocessing, path: Path, data: DataConfig) -> Dataset:
    """Instruction records tokenized, labelled and packed as training read them (data/instructions.py)."""
    from gputrain.data.instructions import read_sequences

    return read_sequences(path, data)


def _text_classes(pre: Preprocessing, path: Path, data: DataConfig) -> Dataset:
    """Texts and labels against the model's classes, by name: a label it has no output for is refused."""
    from gputrain.data.records import read_tokenizer
    from gputrain.data.text_classes import pad_of, read_labelled

    assert pre.class_names is not None
    tokenizer = read_tokenizer(data)
    return read_labelled(path, data, tokenizer, pad_of(tokenizer), pre.class_names, "the model")


def _windows(ids: torch.Tensor, seq_len: int, path: Path) -> TensorData:
    """Consecutive windows of seq_len + 1 ids (x, y shifted by one), as the text and token sources cut them."""
    count = (len(ids) - 1) // seq_len
    if count < 1:
        raise DataError(f"{path}: {len(ids)} tokens, fewer than one window of data.seq_len + 1 = {seq_len + 1}")
    used = count * seq_len
    return TensorData(ids[:used].view(count, seq_len), ids[1 : used + 1].view(count, seq_len))


def _capped(data: Dataset, limit: int | None) -> Dataset:
    """At most `limit` samples (data.max_eval_samples), evenly spread over the data."""
    size = len(data)  # type: ignore[arg-type]
    if limit is None or size <= limit:
        return data
    keep = evenly_spaced(size, limit)
    if isinstance(data, TensorData):
        return TensorData(data.inputs[keep], data.targets[keep])
    return Subset(data, keep)


def check_new_data_overrides(overrides: list[str]) -> bool:
    """Whether the overrides name new data (NEW_DATA_KEYS).

    Raises:
        ConfigError: data.path given empty.
    """
    named = [o for o in overrides if o.partition("=")[0].strip() in NEW_DATA_KEYS]
    for text in named:
        if not text.partition("=")[2].strip():
            raise ConfigError(text.partition("=")[0].strip(), "needs the path of the new data")
    return bool(named)
