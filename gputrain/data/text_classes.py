"""`data.name=text_classes`: text classification from a CSV or JSONL file, a text column
(`data.text_field`) and a label column (`data.label_field`), the text read through the tokenizer
(`data.tokenizer`) into token ids for a sequence classifier (model.name=hf with a
*ForSequenceClassification model directory, or the built-in gpt with its classification head).

Labels are class names or whole numbers (JSONL integers, or CSV cells that are all whole
numbers): the classes are sorted (numbers by value) and numbered from 0, their names kept in the
data's spec, so the run stores them (use/preprocess.py) and evaluate/predict name them. A label
that is missing or of another kind (a float, a boolean, a list) is refused naming its line; so is
a column with one class. With `data.val_path` (a second file of the same format) the validation
labels must be classes of the training file.

Each text becomes at most `data.seq_len` token ids (the end cut off, as a tokenizer's truncation
does), padded on the right with the spec's `pad_id` (the tokenizer's EOS, else 0): a classifier
reads a sequence up to its last token that is not padding. A text of no tokens is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gputrain.config.schema import DataConfig
from gputrain.data.csv_table import MISSING, is_number
from gputrain.data.records import Record, field, read_records, read_tokenizer, source_files, text_field
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import TensorData, split_indices
from gputrain.errors import ConfigError, DataError
from gputrain.text.tokenizer import Tokenizer


def _label(path: Path, record: Record, name: str) -> str | int:
    """The record's label: a class name (str) or a whole number (int)."""
    value: Any = field(path, record, name, "data.label_field")
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in MISSING:
            raise DataError(f"{path}: line {record[0]}: no label ({value!r} in field {name!r})")
        if is_number(text):
            number = float(text)
            return int(number) if number.is_integer() else text
        return text
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise DataError(
        f"{path}: line {record[0]}: label {value!r} in field {name!r} is a JSON {type(value).__name__}; labels are "
        "class names (strings) or whole numbers"
    )


def class_names(path: Path, labels: list[tuple[int, str | int]], column: str) -> list[str | int]:
    """The classes, sorted: all whole numbers (by value) or all names.

    Raises:
        DataError: names mixed with numbers, or a single class.
    """
    numbers = [v for _, v in labels if isinstance(v, int)]
    if numbers and len(numbers) != len(labels):
        line, text = next((line, v) for line, v in labels if not isinstance(v, int))
        raise DataError(
            f"{path}: line {line}: label {text!r} is a name while others in {column!r} are whole numbers; "
            "a label column holds one or the other"
        )
    distinct: list[Any] = sorted({v for _, v in labels})
    if len(distinct) < 2:
        raise DataError(
            f"{path}: field {column!r} holds one class ({distinct[0]!r}) in every record; classification needs at "
            "least two"
        )
    return distinct


def pad_of(tokenizer: Tokenizer) -> int:
    """The id texts are padded with: the tokenizer's EOS, else 0."""
    return tokenizer.eos_id if tokenizer.eos_id is not None else 0


def encode_texts(
    path: Path, records: list[Record], config: DataConfig, tokenizer: Tokenizer, pad_id: int
) -> torch.Tensor:
    """int64 [records, seq_len]: each text's ids, truncated and padded on the right."""
    T = config.seq_len
    out = torch.full((len(records), T), pad_id, dtype=torch.long)
    texts = [text_field(path, record, config.text_field, "data.text_field") for record in records]
    for row, (record, ids) in enumerate(zip(records, tokenizer.encode_batch(texts), strict=True)):
        ids = ids[:T]
        if not ids:
            raise DataError(f"{path}: line {record[0]}: field {config.text_field!r} is empty (no tokens)")
        out[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def read_labelled(
    path: Path, config: DataConfig, tokenizer: Tokenizer, pad_id: int, names: tuple[str, ...], known_from: str
) -> TensorData:
    """A file's texts and labels against classes already fixed (`names`, from `known_from`): a
    separate validation file, or new data for `gputrain evaluate`.

    Raises:
        DataError: naming the file and line of a label that is not one of `names`, and the classes.
    """
    records = read_records(path)
    inputs = encode_texts(path, records, config, tokenizer, pad_id)
    index = {name: i for i, name in enumerate(names)}
    targets = []
    for record in records:
        value = _label(path, record, config.label_field)
        if str(value) not in index:
            shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
            raise DataError(
                f"{path}: line {record[0]}: label {value!r} is not a class of {known_from} ({shown}); the model has "
                "no output for it"
            )
        targets.append(index[str(value)])
    return TensorData(inputs, torch.tensor(targets, dtype=torch.long))


@register_data("text_classes")
def build_text_classes(config: DataConfig, seed: int) -> DataBundle:
    if config.task not in ("auto", "classification"):
        raise ConfigError("data.task", "text_classes data is for classification", config.task)
    path, val_path = source_files(config)
    tokenizer = read_tokenizer(config)
    pad_id = pad_of(tokenizer)
    records = read_records(path)
    inputs = encode_texts(path, records, config, tokenizer, pad_id)
    labels = [(r[0], _label(path, r, config.label_field)) for r in records]
    classes = class_names(path, labels, config.label_field)
    index = {c: i for i, c in enumerate(classes)}
    targets = torch.tensor([index[v] for _, v in labels], dtype=torch.long)
    spec = DataSpec(
        task="classification",
        input_shape=(config.seq_len,),
        num_classes=len(classes),
        vocab_size=tokenizer.vocab_size,
        pad_id=pad_id,
        class_names=tuple(str(c) for c in classes),
    )
    assert spec.class_names is not None
    held = None
    if val_path is not None:
        held = read_labelled(val_path, config, tokenizer, pad_id, spec.class_names, f"the training file {path}")
    train_idx, val_idx, test_idx = split_indices(
        len(inputs), 0.0 if held is not None else config.val_fraction, config.test_fraction, seed
    )
    if len(train_idx) == 0:
        raise DataError(f"{path}: {len(inputs)} records leave none for training after the val/test split")

    def part(idx: torch.Tensor) -> TensorData | None:
        return TensorData(inputs[idx], targets[idx]) if len(idx) else None

    train = part(train_idx)
    assert train is not None
    val = held if held is not None else part(val_idx)
    return DataBundle(train=train, val=val, test=part(test_idx), spec=spec, tokenizer=tokenizer)
