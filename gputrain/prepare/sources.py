"""The corpus `gputrain prepare` reads: the SOURCES given, expanded into files, and each file's documents.

What a source is:
- a text file: ONE document (its whole text), as nanoGPT's and litgpt's text preparers take a file;
- a `.jsonl` file: one document per line, the string in `--field` (default "text"); blank lines skipped;
- a `.parquet` file: one document per row, the string column `--column` (default "text");
- a Hugging Face dataset saved with `save_to_disk` (a folder with `state.json` and its `.arrow` files,
  read with pyarrow, in the order `state.json` lists them): one document per row of `--column`;
- a folder: every file under it (recursively, links followed, a link loop refused) whose name matches
  `--glob` (default `*.txt`), in sorted path order; each file read as its suffix says.
Sources keep the order given. Empty documents ("" or a null cell) hold nothing to learn and are skipped.

Text must be UTF-8: a file that is not (or holds a NUL byte: a binary file among text files) is refused,
naming the file and the byte, never silently mended, so the counts and the bytes the manifest records
are the corpus's own. Every refusal is a DataError: one line naming the file (and line or row).
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.errors import DataError, UsageError, first_line

TEXT, JSONL, PARQUET, ARROW = "text", "jsonl", "parquet", "arrow"
SNIFF_BYTES = 8192
"""The start of a text file looked at for a NUL byte before any work."""


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file of the corpus: its resolved path, how it is read, its size."""

    path: Path
    kind: str
    size: int


def _kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return JSONL
    if suffix == ".parquet":
        return PARQUET
    if suffix == ".arrow":
        return ARROW
    return TEXT


def _size(path: Path, where: str) -> int:
    try:
        info = path.stat()
    except OSError as err:  # a dangling link, a loop of links, no permission
        if path.is_symlink():
            raise DataError(f"{where}: a symbolic link to nothing (or a loop of links); remove or mend it") from None
        raise DataError(f"{where}: cannot be read ({err.strerror or err})") from None
    if not stat.S_ISREG(info.st_mode):
        raise DataError(f"{where}: not a regular file; give text, JSONL or Parquet files, or folders of them")
    return info.st_size


def _saved_dataset(folder: Path) -> list[SourceFile] | None:
    """The arrow files of a dataset saved with `datasets.Dataset.save_to_disk`, or None where `folder` is none."""
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / "state.json").is_file())
        raise DataError(
            f"{folder}: a dataset of several splits ({', '.join(splits) or 'none saved'}); give one split's folder, "
            f"such as {folder / (splits[0] if splits else 'train')}"
        )
    state_file = folder / "state.json"
    if not (state_file.is_file() and (folder / "dataset_info.json").is_file()):
        return None
    try:
        names = [entry["filename"] for entry in json.loads(state_file.read_text())["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise DataError(f"{state_file}: not a saved dataset's state (its _data_files list)") from None
    return [SourceFile(folder / name, ARROW, _size(folder / name, str(folder / name))) for name in names]


def _walk(folder: Path, pattern: str) -> Iterator[Path]:
    """Files under `folder` matching `pattern`, sorted, links followed; a loop of links refused."""
    seen: list[tuple[int, int]] = []

    def visit(directory: Path) -> Iterator[Path]:
        info = directory.stat()
        key = (info.st_dev, info.st_ino)
        if key in seen:
            raise DataError(f"{directory}: a symbolic link loop (a folder inside itself); remove the link")
        seen.append(key)
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as err:
            raise DataError(f"{directory}: cannot be read ({err.strerror or err})") from None
        for entry in entries:
            path = Path(entry.path)
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
            except OSError as err:
                raise DataError(f"{path}: cannot be read ({err.strerror or err})") from None
            if is_dir:
                yield from visit(path)
            elif fnmatch.fnmatchcase(entry.name, pattern):
                yield path
        seen.pop()

    yield from visit(folder)


def expand(sources: list[str], pattern: str) -> list[SourceFile]:
    """The files SOURCES name, in order (module docstring).

    Raises:
        DataError: a source is missing, unreadable, holds no matching file, or a file is named twice.
    """
    files: list[SourceFile] = []
    for given in sources:
        path = Path(given)
        if not os.path.lexists(path):
            raise DataError(f"source {given}: no such file or folder")
        if path.is_dir():
            dataset = _saved_dataset(path)
            if dataset is not None:
                files.extend(SourceFile(f.path.resolve(), f.kind, f.size) for f in dataset)
                continue
            found = [SourceFile(p.resolve(), _kind_of(p), _size(p, str(p))) for p in _walk(path, pattern)]
            if not found:
                raise DataError(f"source {given}: holds no file matching {pattern}; give --glob PATTERN")
            files.extend(found)
        else:
            files.append(SourceFile(path.resolve(), _kind_of(path), _size(path, f"source {given}")))
    seen: set[Path] = set()
    for f in files:
        if f.path in seen:
            raise DataError(f"source {f.path}: named twice (a file and a folder holding it?); name each file once")
        seen.add(f.path)
    return files


# ----------------------------------------------------------------- documents


def _pyarrow() -> Any:
    try:  # imported by name: pyarrow has no type stubs, and is optional
        pyarrow = importlib.import_module("pyarrow")
        importlib.import_module("pyarrow.ipc")
        importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise UsageError("reading Parquet and saved datasets needs pyarrow: pip install 'gputrain[lm]'") from None
    return pyarrow


def _text(data: bytes, where: str) -> str:
    nul = data.find(b"\0")
    if nul >= 0:
        raise DataError(f"{where}: not text (a NUL byte at byte {nul}: a binary file?); remove it from the corpus")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{where}: not UTF-8 (byte {err.start}); convert it to UTF-8 (iconv -t UTF-8)") from None


def _jsonl(source: SourceFile, field: str) -> Iterator[tuple[str, int]]:
    with source.path.open("rb") as f:
        for number, line in enumerate(f, 1):
            yield _json_field(line, f"{source.path}:{number}", field), len(line)


def _json_field(line: bytes, where: str, field: str) -> str:
    if not line.strip():
        return ""
    try:
        row = json.loads(line)
    except UnicodeDecodeError as err:
        raise DataError(f"{where}: not UTF-8 (byte {err.start} of the line)") from None
    except ValueError as err:
        raise DataError(f"{where}: not JSON ({first_line(err, 80)}); a JSONL file holds one object a line") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: a JSON {type(row).__name__}, not an object; a JSONL file holds one object a line")
    if field not in row:
        fields = ", ".join(map(str, list(row)[:8]))
        raise DataError(f"{where}: no field {field!r} (fields: {fields}); give --field NAME")
    value = row[field]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field!r} is a JSON {type(value).__name__}, not text; give a text field")
    return value


def _table_batches(source: SourceFile, column: str) -> tuple[Iterator[Any], int | None]:
    """The record batches of a Parquet or Arrow file's `column`, and its rows where the file says."""
    pa = _pyarrow()
    where = str(source.path)
    try:
        if source.kind == PARQUET:
            reader: Any = pa.parquet.ParquetFile(str(source.path))
            schema, rows = reader.schema_arrow, reader.metadata.num_rows
        else:
            reader = pa.ipc.open_stream(pa.memory_map(str(source.path)))
            schema, rows = reader.schema, None
    except (pa.ArrowException, OSError, ValueError) as err:  # a file that is not of its format
        what = "Parquet" if source.kind == PARQUET else "Arrow (a saved dataset's)"
        raise DataError(f"{where}: not a {what} file ({first_line(err, 80)})") from None
    if column not in schema.names:
        raise DataError(f"{where}: no column {column!r} (columns: {', '.join(schema.names[:8])}); give --column NAME")
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{where}: column {column!r} holds {kind}, not text; give a text column")
    if source.kind == PARQUET:
        return reader.iter_batches(batch_size=4096, columns=[column]), rows
    return (batch.select([column]) for batch in reader), rows


def _table(source: SourceFile, column: str) -> Iterator[tuple[str, int]]:
    batches, rows = _table_batches(source, column)
    told = 0
    for batch in batches:
        values = batch.column(0).to_pylist()
        for value in values:
            yield value or "", 0
        if rows:  # the progress of a table: its rows' share of the file
            share = min(source.size, told + source.size * len(values) // rows) - told
            told += share
            yield "", share
    yield "", source.size - told


def documents(source: SourceFile, field: str, column: str) -> Iterator[tuple[str, int]]:
    """The documents of one file with the bytes of it each consumed (for the progress bar), in order.

    Empty documents are yielded as "" (the caller skips them, so the skip is in one place).

    Raises:
        DataError: the file is not of its kind, lacks the field or column, or its text is not UTF-8.
    """
    if source.kind == TEXT:
        try:
            data = source.path.read_bytes()
        except OSError as err:
            raise DataError(f"{source.path}: cannot be read ({err.strerror or err})") from None
        yield _text(data, str(source.path)), len(data)
    elif source.kind == JSONL:
        yield from _jsonl(source, field)
    else:
        yield from _table(source, column)


def check(source: SourceFile, field: str, column: str) -> None:
    """A quick look at a file's start before any work: its kind, field or column (the first document).

    Raises:
        DataError: as `documents` would for the file's first document.
    """
    if source.kind == TEXT:
        with source.path.open("rb") as f:
            head = f.read(SNIFF_BYTES)
        if b"\0" in head:  # a binary file shows a NUL early (as git tells binary from text)
            _text(head, str(source.path))
        return
    for _ in documents(source, field, column):
        return
