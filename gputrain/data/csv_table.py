"""CSV tables: numeric feature columns and one label column.

Read strictly, so that a file is either read as it means or refused with its line and column:

- UTF-8 text (a byte-order mark is dropped, other bytes are an error naming the line); Windows
  (CRLF) and old Mac (CR) line endings; quoted fields (a quote never closed is an error naming the
  line it opens on); blank lines and lines of only separators carry nothing and are passed over; a
  separator at the end of every line (an empty last column) is dropped.
- The first row is a header when none of its cells is a number; its names must be non-empty
  (the first may be empty: pandas' index column) and unique. Otherwise every row is data and the
  columns are `column_0`, `column_1`, ...
- At most MAX_COLUMNS columns, checked on the first row before the rest of the file is read.
- Every row has the header's number of cells; feature cells are finite numbers within float32.
- Labels: every row needs one (an empty cell or a missing-value marker such as `nan`, `NA`, `null`
  is an error, never a class or a number). All labels are numbers or all are class names.
  Text labels are classes (sorted); whole numbers are classes (sorted by value, so `1` and `1.0`
  are one class) unless nearly every row has its own value, which is refused as ambiguous
  (`data.task` decides); fractional numbers are a regression target, unless a few of them (≤ 5% of
  the rows) stand among whole numbers of a handful of values: such stray cells are refused, naming
  the first (`data.task` decides). A classification needs at least two classes.
"""

from __future__ import annotations

import csv
import io
import math
from decimal import Decimal, InvalidOperation
from pathlib import Path

import torch

from gputrain.config.paths import check_data_path
from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import split_tensors
from gputrain.errors import ConfigError, DataError

_BOM = b"\xef\xbb\xbf"
_FLOAT32_MAX = 3.4028234663852886e38
MISSING = frozenset(
    {"", "na", "n/a", "nan", "-nan", "+nan", "null", "none", "nil", "?", "-", "--", "#n/a", "#na", "<na>", "missing"}
)
"""Cells that mean 'no value' (compared lower-cased): never a label, never a column name."""
_MIN_AMBIGUOUS_CLASSES = 10
"""Whole-number labels with more distinct values than this and than half the rows are refused in
data.task=auto: as classes, most would have a single sample; they look like a numeric target."""

_STRAY_FRACTIONS = 0.05
"""In data.task=auto, fractional labels in at most this share of the rows, among whole numbers of at
most _MIN_AMBIGUOUS_CLASSES values, are refused as stray cells rather than read as a regression target."""

MAX_COLUMNS = 10_000
"""Columns a CSV table may have (features and label), checked on its first row before the rest is read."""
_FIRST_ROW_BYTES = 1 << 23
"""Bytes read to count the columns of the first row: 8 MiB, room for MAX_COLUMNS cells of 800 bytes."""

Row = tuple[int, list[str]]  # (line number in the file, cells)


def is_number(text: str) -> bool:
    """Whether Python reads `text` as a number (float's rules: '1e3', ' 2 ', 'nan')."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _decimal(text: str) -> Decimal | None:
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def _decode(path: Path) -> str:
    """The file as text: UTF-8, byte-order mark dropped."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"{path}: cannot read: {err.strerror or err}") from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise DataError(f"{path}: UTF-16 text (it starts with a UTF-16 byte-order mark); save the CSV file as UTF-8")
    body = raw[len(_BOM) :] if raw.startswith(_BOM) else raw
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        newline = b"\n" if b"\n" in body else b"\r"
        line = body[: err.start].count(newline) + 1
        raise DataError(
            f"{path}: line {line}: byte 0x{body[err.start]:02x} is not UTF-8 text "
            "(a binary file, or another encoding such as Latin-1); save the CSV file as UTF-8"
        ) from None
    nul = text.find("\x00")
    if nul >= 0:
        raise DataError(f"{path}: line {_line_of(text, nul)}: a NUL byte; not a text CSV file (a binary file?)")
    return text


def _line_of(text: str, offset: int) -> int:
    return len(text[:offset].splitlines()) or 1


def _parse(path: Path, text: str) -> list[Row]:
    """The rows that hold something, each with the line it starts on."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows: list[Row] = []
    start = 1
    try:
        for cells in reader:
            if any(cell.strip() for cell in cells):
                rows.append((start, cells))
            start = reader.line_num + 1
    except csv.Error as err:
        if "end of data" in str(err):
            problem = "a quoted field opened on this line is never closed"
        elif "field limit" in str(err):
            problem = f"a field longer than {csv.field_size_limit()} characters (a quote that is never closed?)"
        else:
            problem = f'malformed quoting ({err}); a quote inside a quoted field is written twice ("")'
        raise DataError(f"{path}: line {start}: {problem}") from None
    # a separator at the end of every line: an empty last column, not data
    while rows and all(len(cells) > 1 and not cells[-1].strip() for _, cells in rows):
        rows = [(line, cells[:-1]) for line, cells in rows]
    return rows


def _header(path: Path, rows: list[Row]) -> tuple[list[str], bool]:
    """(column names, whether the first row is a header)."""
    line, cells = rows[0]
    _check_count(path, len(cells))  # check_width's count, where its prefix held less than the first row
    names = [c.strip() for c in cells]
    if any(is_number(name) for name in names):
        return [f"column_{i}" for i in range(len(names))], False
    for i, name in enumerate(names):
        if not name and i > 0:
            raise DataError(
                f"{path}: line {line}, column {i + 1}: empty; as a header, line {line} needs a name for every "
                f"column, and as data, a value in every cell"
            )
        if name and name.lower() in MISSING:
            raise DataError(
                f"{path}: line {line}, column {i + 1}: {name!r} is a missing-value marker, not a column name; "
                f"as data, line {line} has no number in any feature column"
            )
    names = [name or f"column_{i}" for i, name in enumerate(names)]
    seen: dict[str, int] = {}  # a dict, not a scan of the names before each: linear in the columns
    for i, name in enumerate(names):
        if name in seen:
            raise DataError(
                f"{path}: line {line}: column name {name!r} is used twice (columns {seen[name] + 1} and "
                f"{i + 1}); column names must be unique"
            )
        seen[name] = i
    return names, True


def check_width(path: Path) -> None:
    """Refuse a file of more than MAX_COLUMNS columns from its first row alone, before the rest is
    read: each column costs a Python float per row. Only the first _FIRST_ROW_BYTES are read (a first
    row longer than that counts the cells they hold: at least that many). A first row that cannot be
    read is left to the full reading, which names what is wrong; `_header` checks the count again.

    Raises:
        DataError: naming the file, its number of columns and the limit.
    """
    try:
        with path.open("rb") as f:
            head = f.read(_FIRST_ROW_BYTES)
    except OSError:
        return
    text = head.decode("utf-8", errors="ignore").removeprefix("\ufeff")
    try:
        rows = csv.reader(io.StringIO(text, newline=""))
        first = next((cells for cells in rows if any(c.strip() for c in cells)), None)
    except csv.Error:
        return
    if first is not None:
        whole = len(head) < _FIRST_ROW_BYTES  # the whole file was read: the count is exact
        _check_count(path, len(first) - (not first[-1].strip()), "" if whole else "at least ")


def _check_count(path: Path, count: int, at_least: str = "") -> None:
    if count > MAX_COLUMNS:
        raise DataError(
            f"{path}: {at_least}{count:,} columns on its first row; a CSV file read as a table has at most "
            f"{MAX_COLUMNS:,} (MAX_COLUMNS); for wider data, hold the features in arrays (.npy for predict, "
            "tensors for Trainer)"
        )


def _separator_hint(rows: list[Row]) -> str:
    first = rows[0][1][0]
    for sep, name in ((";", "';'"), ("\t", "tabs"), ("|", "'|'")):
        if sep in first:
            return f" (it seems to separate values with {name}; save it comma-separated)"
    return ""


def _feature(path: Path, line: int, column: str, cell: str, hint: str) -> float:
    text = cell.strip()
    where = f"{path}: line {line}, column {column!r}"
    try:
        value = float(text)
    except ValueError:
        if not text:
            raise DataError(f"{where}: empty (a missing value); feature cells must be numbers{hint}") from None
        comma = " (a decimal comma? write 1.5, not 1,5)" if "," in text and is_number(text.replace(",", ".")) else ""
        raise DataError(
            f"{where}: {text!r} is not a number{comma}; feature columns must be numeric (data.label_column names "
            f"the label){hint}"
        ) from None
    if not math.isfinite(value):
        raise DataError(f"{where}: {text!r} is not finite (a missing value?); feature cells must be finite numbers")
    if abs(value) > _FLOAT32_MAX:
        raise DataError(f"{where}: {text!r} is beyond float32's range (±3.4e38), where features are held")
    return value


def _label_error(path: Path, line: int, column: str, problem: str) -> DataError:
    return DataError(f"{path}: line {line}, column {column!r}: {problem}")


def _targets(path: Path, column: str, labels: list[tuple[int, str]], task: str) -> tuple[torch.Tensor, str, int | None]:
    """(targets, task, number of classes) from the label cells, checked (module docstring)."""
    for line, text in labels:
        if text.lower() in MISSING:
            shown = "empty" if not text else f"{text!r} is a missing-value marker"
            raise _label_error(path, line, column, f"{shown}; every row needs a label (fill it in or drop the row)")
    values = [_decimal(text) for _, text in labels]
    numeric = [i for i, v in enumerate(values) if v is not None]
    if numeric and len(numeric) != len(values):
        texts = [i for i, v in enumerate(values) if v is None]
        odd, kind, other = (
            (texts[0], "text", "numbers") if len(texts) <= len(numeric) else (numeric[0], "a number", "text")
        )
        line, text = labels[odd]
        raise _label_error(
            path,
            line,
            column,
            f"{text!r} is {kind}, but the other labels are {other}; labels must be all numbers or all class names",
        )
    if not numeric:  # class names
        if task == "regression":
            line, text = labels[0]
            raise _label_error(path, line, column, f"{text!r} is not a number; data.task=regression needs numbers")
        names = sorted({text for _, text in labels})
        index = {name: i for i, name in enumerate(names)}
        return _classes(path, column, names, torch.tensor([index[t] for _, t in labels], dtype=torch.long))
    decimals = [v for v in values if v is not None]
    for (line, text), value in zip(labels, decimals):
        if not value.is_finite():
            raise _label_error(path, line, column, f"{text!r} is not a finite number; every row needs a label")
    fractional = next((i for i, v in enumerate(decimals) if v != v.to_integral_value()), None)
    if task == "classification" and fractional is not None:
        line, text = labels[fractional]
        raise _label_error(
            path,
            line,
            column,
            f"{text!r} is not a whole number; data.task=classification needs whole-number or text labels",
        )
    if task == "auto" and fractional is not None:
        _check_not_stray_fractions(path, column, labels, decimals)
    if task == "regression" or (task == "auto" and fractional is not None):
        targets = []
        for (line, text), value in zip(labels, decimals):
            number = float(value)
            if not abs(number) <= _FLOAT32_MAX:
                raise _label_error(path, line, column, f"{text!r} is beyond float32's range (±3.4e38)")
            targets.append([number])
        return torch.tensor(targets, dtype=torch.float32), "regression", None
    distinct = sorted(set(decimals))
    if task == "auto" and len(distinct) > max(_MIN_AMBIGUOUS_CLASSES, len(decimals) // 2):
        raise DataError(
            f"{path}: column {column!r}: {len(distinct)} distinct whole numbers in {len(decimals)} rows: as classes, "
            "most would have one sample; set data.task=regression for a numeric target, or "
            "data.task=classification if they are classes"
        )
    class_of = {value: i for i, value in enumerate(distinct)}  # Decimal('1') == Decimal('1.0'): one class
    return _classes(path, column, [str(v) for v in distinct], torch.tensor([class_of[v] for v in decimals]))


def _check_not_stray_fractions(path: Path, column: str, labels: list[tuple[int, str]], decimals: list[Decimal]) -> None:
    """data.task=auto reads fractional labels as a regression target; where a few of them stand among
    whole numbers of a handful of values (0 and 1 in all rows but one), that one cell would quietly turn
    a classification into a regression: refused, naming the first, with the two ways on."""
    whole = {v for v in decimals if v == v.to_integral_value()}
    fractions = [i for i, v in enumerate(decimals) if v != v.to_integral_value()]
    if len(whole) > _MIN_AMBIGUOUS_CLASSES or len(fractions) > _STRAY_FRACTIONS * len(decimals):
        return
    line, text = labels[fractions[0]]
    values = ", ".join(str(v) for v in sorted(whole))
    raise _label_error(
        path,
        line,
        column,
        f"{text!r} is fractional, like {len(fractions)} label(s) in {len(decimals)}, while the rest are whole "
        f"numbers of {len(whole)} values ({values}): as classes, fix those cells; if the column is a numeric "
        "target, set data.task=regression",
    )


def _classes(path: Path, column: str, names: list[str], targets: torch.Tensor) -> tuple[torch.Tensor, str, int]:
    if len(names) < 2:
        raise DataError(
            f"{path}: column {column!r} holds one class ({names[0]!r}) in every row; classification needs at least "
            "two (data.task=regression for a numeric target)"
        )
    return targets.long(), "classification", len(names)


def load_csv(path: Path, label_column: str | None, task: str) -> tuple[torch.Tensor, torch.Tensor, DataSpec]:
    """(features float32 [N, F], targets, spec) from a CSV file, checked (module docstring).

    Raises:
        DataError: naming the file, and the line and column where one is at fault.
        ConfigError: data.label_column names no column, or data.task=lm.
    """
    if task == "lm":
        raise ConfigError("data.task", "csv data cannot be used for language modelling", task)
    check_width(path)
    rows = _parse(path, _decode(path))
    if not rows:
        raise DataError(f"{path}: the file is empty")
    header, has_header = _header(path, rows)
    data = rows[1:] if has_header else rows
    if len(header) < 2:
        raise DataError(
            f"{path}: line {rows[0][0]} has a single column; data.name=csv needs feature columns and a label "
            f"column, comma-separated{_separator_hint(rows)}"
        )
    if not data:
        raise DataError(f"{path}: has a header but no data rows")
    label_index = len(header) - 1
    if label_column is not None:
        if label_column not in header:
            raise ConfigError(
                "data.label_column", f"no such column in {path}; columns: {', '.join(header)}", label_column
            )
        label_index = header.index(label_column)
    first_line = data[0][0]
    features: list[list[float]] = []
    labels: list[tuple[int, str]] = []
    for line, cells in data:
        if len(cells) != len(header):
            shape = f"the header (line {rows[0][0]})" if has_header else f"line {rows[0][0]}"
            raise DataError(f"{path}: line {line} has {len(cells)} columns, expected {len(header)} as {shape}")
        hint = (
            f" (line {line} was read as data: a header row needs a name, not a number, in every column)"
            if line == first_line and not has_header
            else ""
        )
        features.append(
            [_feature(path, line, header[c], cell, hint) for c, cell in enumerate(cells) if c != label_index]
        )
        labels.append((line, cells[label_index].strip()))
    inputs = torch.tensor(features, dtype=torch.float32)
    targets, kind, num_classes = _targets(path, header[label_index], labels, task)
    if kind == "regression":
        return inputs, targets, DataSpec(task="regression", input_shape=(inputs.shape[1],), num_outputs=1)
    return inputs, targets, DataSpec(task="classification", input_shape=(inputs.shape[1],), num_classes=num_classes)


@register_data("csv")
def build_csv(config: DataConfig, seed: int) -> DataBundle:
    if config.path is None:
        raise ConfigError("data.path", "data.name=csv needs the path of a .csv file")
    check_data_path(config)
    path = Path(config.path)
    inputs, targets, spec = load_csv(path, config.label_column, config.task)
    return split_tensors(inputs, targets, spec, config, seed)
