"""New CSV rows read the way the run's own CSV file was: its feature columns, in its order, and its
class names. Cells are read and checked by data/csv_table.py's own parser (quoting, line endings,
a header told from data, finite float32 features), so a new file is held to the training file's rules.

A new file with a header may order its columns freely and may leave out the label column (predict
needs none). Without a header, its columns are positional: the features in the training order,
optionally with the label where the training file had it.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import torch

from gputrain.data.csv_table import MISSING, _decode, _feature, _header, _parse, check_width, load_csv
from gputrain.errors import DataError


@dataclass(frozen=True, slots=True)
class TableLayout:
    """The columns of the CSV file a run trained on."""

    header: bool
    """Its first row named the columns (else they are column_0, column_1, ...)."""
    names: tuple[str, ...]
    """Every column, in file order."""
    label_index: int
    classes: tuple[str, ...] | None
    """Classification: the class names, in the order of the model's outputs."""

    @property
    def label(self) -> str:
        return self.names[self.label_index]

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(name for i, name in enumerate(self.names) if i != self.label_index)


def read_layout(path: Path, label_column: str | None, task: str) -> TableLayout:
    """The layout of the run's CSV file `path` (data.path), with the class names its labels give.

    Raises:
        DataError, ConfigError: the file no longer reads as it did for training.
    """
    _, targets, spec = load_csv(path, label_column, task)
    rows = _parse(path, _decode(path))
    names, has_header = _header(path, rows)
    label_index = names.index(label_column) if label_column is not None else len(names) - 1
    classes = None
    if spec.task == "classification":
        assert spec.num_classes is not None
        cells = [cells[label_index].strip() for _, cells in (rows[1:] if has_header else rows)]
        # a class's name is the label text of its first row (load_csv numbers the classes)
        first: dict[int, str] = {}
        for cell, target in zip(cells, targets.tolist()):
            first.setdefault(target, cell)
        classes = tuple(first[i] for i in range(spec.num_classes))
    return TableLayout(has_header, tuple(names), label_index, classes)


def read_rows(
    path: Path, layout: TableLayout, *, need_labels: bool
) -> tuple[list[int], torch.Tensor, torch.Tensor | None]:
    """(line numbers, features float32 [N, F] in the training order, targets or None) of a new CSV file.

    Targets are class indices of the run's classes (classification) or float32 [N, 1] values; they
    are read where the label column is present, and required with `need_labels`.

    Raises:
        DataError: naming the file (and its line and column): missing columns, a class the model does
            not know, a cell that is not a number.
    """
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    check_width(path)
    rows = _parse(path, _decode(path))
    if not rows:
        raise DataError(f"{path}: the file is empty")
    names, has_header = _header(path, rows)
    data = rows[1:] if has_header else rows
    if not data:
        raise DataError(f"{path}: has a header but no data rows")
    where = _column_positions(path, layout, names, has_header)
    label_at = where.get(layout.label)
    if need_labels and label_at is None:
        raise DataError(f"{path}: no label column {layout.label!r}; evaluation needs the labels")
    lines, features, labels = [], [], []
    for line, cells in data:
        if len(cells) != len(names):
            raise DataError(f"{path}: line {line} has {len(cells)} columns, expected {len(names)} as line {rows[0][0]}")
        features.append([_feature(path, line, name, cells[where[name]], "") for name in layout.features])
        if label_at is not None:
            labels.append((line, cells[label_at].strip()))
        lines.append(line)
    targets = _targets(path, layout, labels) if label_at is not None else None
    return lines, torch.tensor(features, dtype=torch.float32), targets


def _column_positions(path: Path, layout: TableLayout, names: list[str], has_header: bool) -> dict[str, int]:
    """Where each of the run's columns is in the new file: by name with a header, else by position."""
    expected = ", ".join(layout.features)
    if layout.header and has_header:
        missing = [name for name in layout.features if name not in names]
        if missing:
            raise DataError(
                f"{path}: no column {', '.join(map(repr, missing))}; the model reads the columns {expected} "
                f"(any order; the label {layout.label!r} may be left out)"
            )
        return {name: names.index(name) for name in layout.names if name in names}
    if len(names) == len(layout.names):
        return {name: i for i, name in enumerate(layout.names)}
    if len(names) == len(layout.features):
        return {name: i for i, name in enumerate(layout.features)}
    raise DataError(
        f"{path}: {len(names)} columns; the model reads {len(layout.features)} features ({expected}), "
        f"{'with a header naming them, or ' if layout.header else ''}in this order, optionally with the label "
        f"{layout.label!r} as column {layout.label_index + 1}"
    )


def _targets(path: Path, layout: TableLayout, labels: list[tuple[int, str]]) -> torch.Tensor:
    for line, text in labels:
        if text.lower() in MISSING:
            raise DataError(f"{path}: line {line}, column {layout.label!r}: no label; every row needs one")
    if layout.classes is None:
        values = []
        for line, text in labels:
            try:
                values.append([float(text)])
            except ValueError:
                raise DataError(f"{path}: line {line}, column {layout.label!r}: {text!r} is not a number") from None
        return torch.tensor(values, dtype=torch.float32)
    index = {_class_key(name): i for i, name in enumerate(layout.classes)}
    targets = []
    for line, text in labels:
        found = index.get(_class_key(text))
        if found is None:
            raise DataError(
                f"{path}: line {line}, column {layout.label!r}: {text!r} is not one of the model's classes "
                f"({', '.join(layout.classes)})"
            )
        targets.append(found)
    return torch.tensor(targets, dtype=torch.long)


def _class_key(text: str) -> str | Decimal:
    """Whole-number class labels compare by value (`1` and `1.0` are one class), as training read them."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        return text
    return value.normalize() if value.is_finite() else text
