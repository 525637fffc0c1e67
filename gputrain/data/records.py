"""Records of a JSONL or CSV file, each with the line it starts on: what the text data sources
(instructions, text_classes) read their fields from.

JSONL (`.jsonl`, `.json`, `.ndjson`): UTF-8, one JSON object per line; blank lines are passed
over; a line that is not JSON, or JSON that is not an object, is refused naming the line. CSV
(any other suffix): read as data/csv_table.py reads tables (UTF-8, quoting, line numbers), whose
first row must name the columns; each row becomes {column: cell}. And the tokenizer they read
the text through (data.tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gputrain.config.paths import check_data_path
from gputrain.config.schema import DataConfig
from gputrain.data.csv_table import _decode, _header, _parse
from gputrain.errors import ConfigError, DataError
from gputrain.text.tokenizer import Tokenizer, load_tokenizer

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")

Record = tuple[int, dict[str, Any]]  # (line, fields)


def is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in JSONL_SUFFIXES


def read_jsonl(path: Path) -> list[Record]:
    """The objects of a JSONL file, each with its line number.

    Raises:
        DataError: naming the file and the line: not UTF-8, not JSON, not an object; or no record.
    """
    records: list[Record] = []
    for number, line in enumerate(_decode(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: line {number}: not JSON ({err.msg}, column {err.colno})") from None
        if not isinstance(value, dict):
            raise DataError(
                f"{path}: line {number}: a JSON {type(value).__name__}, not an object; each line holds one "
                'record, e.g. {"prompt": "...", "response": "..."}'
            )
        records.append((number, value))
    if not records:
        raise DataError(f"{path}: no records (the file is empty)")
    return records


def read_csv_records(path: Path) -> list[Record]:
    """The rows of a CSV file with a header, as {column: cell}.

    Raises:
        DataError: naming the file (and line): unreadable, no header, a row of another width.
    """
    rows = _parse(path, _decode(path))
    if not rows:
        raise DataError(f"{path}: the file is empty")
    header, has_header = _header(path, rows)
    if not has_header:
        raise DataError(f"{path}: line {rows[0][0]}: the first row must name the columns (a header row)")
    records: list[Record] = []
    for line, cells in rows[1:]:
        if len(cells) != len(header):
            raise DataError(f"{path}: line {line} has {len(cells)} columns, expected {len(header)} as the header")
        records.append((line, dict(zip(header, cells, strict=True))))
    if not records:
        raise DataError(f"{path}: has a header but no data rows")
    return records


def read_records(path: Path) -> list[Record]:
    """JSONL or CSV records by the file's suffix (module docstring)."""
    return read_jsonl(path) if is_jsonl(path) else read_csv_records(path)


def field(path: Path, record: Record, name: str, option: str) -> Any:
    """The record's `name` field.

    Raises:
        DataError: naming the file, line, field and the option that names it.
    """
    line, values = record
    if name not in values:
        keys = ", ".join(map(repr, list(values)[:8])) or "none"
        raise DataError(f"{path}: line {line}: no field {name!r} ({option}; the record's fields: {keys})")
    return values[name]


def text_field(path: Path, record: Record, name: str, option: str) -> str:
    """The record's `name` field, which must be a string.

    Raises:
        DataError: naming the file, line and field: missing, or not a string.
    """
    value = field(path, record, name, option)
    if not isinstance(value, str):
        raise DataError(
            f"{path}: line {record[0]}: field {name!r} is a JSON {type(value).__name__}, not a string of text"
        )
    return value


def source_files(config: DataConfig) -> tuple[Path, Path | None]:
    """(data.path, data.val_path or None) of a text data source, each a file.

    Raises:
        ConfigError: data.path is unset.
        DataError: either names no file.
    """
    if config.path is None:
        raise ConfigError("data.path", f"data.name={config.name} needs a JSONL or CSV file")
    check_data_path(config)
    val = Path(config.val_path) if config.val_path is not None else None
    if val is not None and not val.is_file():
        raise DataError(f"data.val_path: no such file: {val}")
    return Path(config.path), val


def read_tokenizer(config: DataConfig) -> Tokenizer:
    """The tokenizer of data.tokenizer.

    Raises:
        ConfigError: data.tokenizer is unset.
        DataError: it cannot be read (gputrain.text.tokenizer.load_tokenizer).
    """
    if config.tokenizer is None:
        raise ConfigError(
            "data.tokenizer",
            f"data.name={config.name} reads text through a tokenizer: give a tokenizer.json or a model directory "
            "holding one",
        )
    return load_tokenizer(config.tokenizer)
