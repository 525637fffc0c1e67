"""data/csv_table.py's bound on columns: a file wider than MAX_COLUMNS is refused from its first row,
before any other row is parsed, by training's reader and by the readers of new rows (use/tables.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrain.data import csv_table
from gputrain.data.csv_table import MAX_COLUMNS, check_width, load_csv
from gputrain.errors import DataError
from gputrain.use.tables import TableLayout, read_rows


def _wide(path: Path, columns: int, rows: int = 3, end: str = "") -> Path:
    header = ",".join(f"c{i}" for i in range(columns)) + end
    path.write_text(header + "\n" + (",".join("1" for _ in range(columns)) + end + "\n") * rows)
    return path


@pytest.fixture
def no_row_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(*args: object) -> None:
        raise AssertionError("the rows were parsed before the width was checked")

    monkeypatch.setattr(csv_table, "_parse", parse)
    import gputrain.use.tables as tables

    monkeypatch.setattr(tables, "_parse", parse)


def test_a_file_wider_than_the_bound_is_refused_before_its_rows_are_read(tmp_path: Path, no_row_parsing) -> None:
    path = _wide(tmp_path / "wide.csv", MAX_COLUMNS + 1)
    message = f"{path}: 10,001 columns on its first row; a CSV file read as a table has at most 10,000 (MAX_COLUMNS)"
    with pytest.raises(DataError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        load_csv(path, None, "auto")
    layout = TableLayout(True, ("a", "b", "y"), 2, None)
    with pytest.raises(DataError, match=r"10,001 columns on its first row"):
        read_rows(path, layout, need_labels=False)


def test_a_headerless_wide_file_is_refused_too(tmp_path: Path, no_row_parsing) -> None:
    path = tmp_path / "numbers.csv"
    path.write_text((",".join("2" for _ in range(MAX_COLUMNS + 5)) + "\n") * 2)
    with pytest.raises(DataError, match=r"10,005 columns on its first row"):
        check_width(path)


def test_the_bound_itself_and_a_separator_ending_each_line_pass(tmp_path: Path) -> None:
    check_width(_wide(tmp_path / "a.csv", MAX_COLUMNS))
    check_width(_wide(tmp_path / "b.csv", MAX_COLUMNS, end=","))  # an empty last column is dropped


def test_a_name_used_twice_far_along_a_wide_header_is_named_with_both_columns(tmp_path: Path) -> None:
    names = [f"c{i}" for i in range(5_000)]
    names[4_999] = "c17"
    path = tmp_path / "dup.csv"
    path.write_text(",".join(names) + ",y\n" + ",".join("1" for _ in range(5_001)) + "\n")
    with pytest.raises(DataError, match=r": line 1: column name 'c17' is used twice \(columns 18 and 5000\)"):
        load_csv(path, None, "auto")


def test_only_a_prefix_is_read_and_a_first_row_longer_than_it_is_counted_by_the_full_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(csv_table, "MAX_COLUMNS", 20)
    monkeypatch.setattr(csv_table, "_FIRST_ROW_BYTES", 64)
    short = tmp_path / "short.csv"
    short.write_text(",".join("1" * 40) + "\n" + ",".join("1" * 40) + "\n")  # 64 bytes hold 32 of its 40 cells
    with pytest.raises(DataError, match=r"short.csv: at least 32 columns on its first row; .* at most 20"):
        check_width(short)
    long_names = tmp_path / "long.csv"
    long_names.write_text(",".join(f"{'n' * 30}{i}" for i in range(25)) + "\n" + ",".join("1" * 25) + "\n")
    check_width(long_names)  # the prefix holds 3 of its cells: not enough to tell
    with pytest.raises(DataError, match=r"long.csv: 25 columns on its first row; .* at most 20"):
        load_csv(long_names, None, "auto")  # the full reading counts them
