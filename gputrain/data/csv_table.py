"""CSV tables: numeric feature columns and one label column.

String labels become classes (sorted), integer labels are classes, fractional labels make a
regression task. A bad cell is reported with its file, line and column.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import torch

from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import split_tensors
from gputrain.errors import ConfigError, DataError


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_rows(path: Path) -> tuple[list[str], list[list[str]], int]:
    """Header names, data rows, and the file line number of the first data row."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = [row for row in csv.reader(f) if row and any(cell.strip() for cell in row)]
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a UTF-8 text CSV file") from None
    if not rows:
        raise DataError(f"{path}: the file is empty")
    # A first row whose feature cells are not all numbers is a header (labels may be strings).
    has_header = not all(_is_number(cell) for cell in rows[0][:-1]) or not any(_is_number(c) for c in rows[0])
    if has_header:
        return [c.strip() for c in rows[0]], rows[1:], 2
    return [f"column_{i}" for i in range(len(rows[0]))], rows, 1


def load_csv(path: Path, label_column: str | None, task: str) -> tuple[torch.Tensor, torch.Tensor, DataSpec]:
    header, rows, first_line = _read_rows(path)
    if not rows:
        raise DataError(f"{path}: has a header but no data rows")
    label_index = len(header) - 1
    if label_column is not None:
        if label_column not in header:
            raise ConfigError(
                "data.label_column", f"no such column in {path}; columns: {', '.join(header)}", label_column
            )
        label_index = header.index(label_column)
    features: list[list[float]] = []
    labels: list[str] = []
    for offset, row in enumerate(rows):
        line = first_line + offset
        if len(row) != len(header):
            raise DataError(f"{path}: line {line} has {len(row)} columns, expected {len(header)}")
        values = []
        for col, cell in enumerate(row):
            if col == label_index:
                continue
            try:
                value = float(cell)
            except ValueError:
                raise DataError(
                    f"{path}: line {line}, column {header[col]!r}: {cell.strip()!r} is not a number "
                    "(feature columns must be numeric)"
                ) from None
            if not math.isfinite(value):
                raise DataError(f"{path}: line {line}, column {header[col]!r}: {cell.strip()!r} is not finite")
            values.append(value)
        features.append(values)
        labels.append(row[label_index].strip())
    inputs = torch.tensor(features, dtype=torch.float32)
    numeric = all(_is_number(v) for v in labels)
    integral = numeric and all(float(v).is_integer() for v in labels)
    if task == "regression" or (task == "auto" and numeric and not integral):
        if not numeric:
            raise DataError(f"{path}: column {header[label_index]!r} must be numeric for regression")
        targets = torch.tensor([[float(v)] for v in labels], dtype=torch.float32)
        return inputs, targets, DataSpec(task="regression", input_shape=(inputs.shape[1],), num_outputs=1)
    if task == "lm":
        raise ConfigError("data.task", "csv data cannot be used for language modelling", task)
    classes = sorted(set(labels), key=(lambda v: float(v)) if numeric else str)
    index = {name: i for i, name in enumerate(classes)}
    targets = torch.tensor([index[v] for v in labels], dtype=torch.long)
    return inputs, targets, DataSpec(task="classification", input_shape=(inputs.shape[1],), num_classes=len(classes))


@register_data("csv")
def build_csv(config: DataConfig, seed: int) -> DataBundle:
    if config.path is None:
        raise ConfigError("data.path", "data.name=csv needs the path of a .csv file")
    path = Path(config.path)
    if not path.is_file():
        raise DataError(f"data.path: no such file: {path}")
    inputs, targets, spec = load_csv(path, config.label_column, config.task)
    return split_tensors(inputs, targets, spec, config, seed)
