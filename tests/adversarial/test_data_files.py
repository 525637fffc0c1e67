"""Data files that are wrong in quiet or loud ways (issue 13, section 6), written here as real files in
their real formats: CSV text, PNG/JPEG through Pillow, MNIST's IDX, nanoGPT's uint16 `.bin`.

Each case asserts the exact outcome: a DataError naming the file and the line/column (or item, or
sample) with what would be right; or a correct reading (the tensors as the file means them); or,
for a sample that cannot be read mid-run, the guard's skip (counted) or fail (naming the split and
the file). A few go through the real command: exit 2, one line, no traceback.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.data.guard import BadSample, GuardedDataset, guarded_collate, unwrap
from gputrain.data.image_folder import decode_image
from gputrain.data.registry import DataBundle
from gputrain.distributed.context import DistContext
from gputrain.errors import ConfigError, DataError, RunError
from gputrain.evaluate.evaluator import EvalSpec, Evaluator, shard_for_eval
from gputrain.evaluate.layout import eval_layout
from gputrain.train.tasks import Task
from tests.conftest import run_cli
from tests.unit.data.files import mnist_like, write_idx, write_image_folder, write_mnist, write_tokens


def _build(name: str, path: Path, **fields: Any) -> DataBundle:
    config = load_config({"data.name": name, "data.path": str(path), **{f"data.{k}": v for k, v in fields.items()}})
    return build_data(config.data, seed=0)


def _raises(fn: Callable[[], Any], path: Path, pattern: str, kind: type[Exception] = DataError) -> str:
    """`fn` raises `kind` whose whole message is `path` + `pattern` (a regex), on one line."""
    with pytest.raises(kind) as err:
        fn()
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message, message
    assert re.fullmatch(re.escape(str(path)) + pattern, message), message
    return message


# ----------------------------------------------------------------------------- CSV
def _rows(n: int = 30, label: Callable[[int], object] = lambda i: i % 3) -> str:
    return "".join(f"{i}.5,{i * 2},{label(i)}\n" for i in range(n))


HEADER = "a,b,y\n"
# (id, file text, data.* fields, the message after the file's path: a regex)
CSV_ERRORS = [
    ("nan-label", HEADER + "1,2,0\n3,4,nan\n5,6,1\n", {},
     r": line 3, column 'y': 'nan' is a missing-value marker; every row needs a label \(fill it in or drop the row\)"),
    ("NaN-label-among-class-names", HEADER + "1,2,cat\n3,4,NaN\n5,6,dog\n", {},
     r": line 3, column 'y': 'NaN' is a missing-value marker; every row needs a label .*"),
    ("empty-label", HEADER + "1,2,cat\n3,4,\n5,6,dog\n", {},
     r": line 3, column 'y': empty; every row needs a label \(fill it in or drop the row\)"),
    ("blank-label", HEADER + "1,2,cat\n3,4,dog\n5,6,   \n", {}, r": line 4, column 'y': empty; every row needs .*"),
    ("NA-label", HEADER + "1,2,0\n3,4,1\n5,6,NA\n", {}, r": line 4, column 'y': 'NA' is a missing-value marker; .*"),
    ("null-label", HEADER + "1,2,cat\n3,4,null\n", {}, r": line 3, column 'y': 'null' is a missing-value marker; .*"),
    ("inf-label", HEADER + "1,2,0.5\n3,4,inf\n5,6,1.5\n", {},
     r": line 3, column 'y': 'inf' is not a finite number; every row needs a label"),
    ("text-among-number-labels", HEADER + "1,2,0\n3,4,1\n5,6,two\n7,8,0\n", {},
     r": line 4, column 'y': 'two' is text, but the other labels are numbers; labels must be all numbers or all "
     r"class names"),
    ("number-among-text-labels", HEADER + "1,2,cat\n3,4,dog\n5,6,7\n7,8,cat\n", {},
     r": line 4, column 'y': '7' is a number, but the other labels are text; .*"),
    ("unique-whole-number-labels", HEADER + _rows(40, lambda i: 100 + 7 * i), {},
     r": column 'y': 40 distinct whole numbers in 40 rows: as classes, most would have one sample; set "
     r"data.task=regression for a numeric target, or data.task=classification if they are classes"),
    ("a-stray-fraction-among-classes", HEADER + _rows(199, lambda i: i % 2) + "1,2,1.5\n", {},
     r": line 201, column 'y': '1.5' is fractional, like 1 label\(s\) in 200, while the rest are whole numbers of 2 "
     r"values \(0, 1\): as classes, fix those cells; if the column is a numeric target, set data.task=regression"),
    ("a-few-stray-fractions-among-classes", HEADER + "1,2,0.5\n" + _rows(40, lambda i: i % 3) + "1,2,2.25\n", {},
     r": line 2, column 'y': '0.5' is fractional, like 2 label\(s\) in 42, while the rest are whole numbers of 3 "
     r"values \(0, 1, 2\): .*"),
    ("fractional-labels-as-classes", HEADER + "1,2,0\n3,4,0.5\n", {"task": "classification"},
     r": line 3, column 'y': '0.5' is not a whole number; data.task=classification needs whole-number or text "
     r"labels"),
    ("text-labels-for-regression", HEADER + "1,2,cat\n3,4,dog\n", {"task": "regression"},
     r": line 2, column 'y': 'cat' is not a number; data.task=regression needs numbers"),
    ("one-class", HEADER + "1,2,cat\n3,4,cat\n5,6,cat\n", {},
     r": column 'y' holds one class \('cat'\) in every row; classification needs at least two \(data.task=regression "
     r"for a numeric target\)"),
    ("headerless-missing-first-cell", "1,,0\n" + _rows(199), {},
     r": line 1, column 'column_1': empty \(a missing value\); feature cells must be numbers \(line 1 was read as "
     r"data: a header row needs a name, not a number, in every column\)"),
    ("header-with-a-number-name", "x,2019,y\n" + _rows(5), {},
     r": line 1, column 'column_0': 'x' is not a number; feature columns must be numeric \(data.label_column "
     r"names the label\) \(line 1 was read as data: .*\)"),
    ("ragged-short-row", HEADER + "1,2,0\n3,4\n", {}, r": line 3 has 2 columns, expected 3 as the header \(line 1\)"),
    ("ragged-long-row", HEADER + "1,2,0\n3,4,1,9\n", {},
     r": line 3 has 4 columns, expected 3 as the header \(line 1\)"),
    ("duplicate-header-names", "a,a,y\n" + _rows(), {},
     r": line 1: column name 'a' is used twice \(columns 1 and 2\); column names must be unique"),
    ("empty-header-name", "a,,y\n" + _rows(), {},
     r": line 1, column 2: empty; as a header, line 1 needs a name for every column, and as data, a value in every "
     r"cell"),
    ("only-a-header", "a,b,y\n\n", {}, r": has a header but no data rows"),
    ("empty-file", "", {}, r": the file is empty"),
    ("only-blank-lines", "\n\r\n  \n,,\n", {}, r": the file is empty"),
    ("latin-1-bytes", b"a,b,y\n1,2,cat\n3,4,caf\xe9\n", {},
     r": line 3: byte 0xe9 is not UTF-8 text \(a binary file, or another encoding such as Latin-1\); save the CSV "
     r"file as UTF-8"),
    ("utf-16", "a,b,y\n1,2,0\n3,4,1\n".encode("utf-16"), {},
     r": UTF-16 text \(it starts with a UTF-16 byte-order mark\); save the CSV file as UTF-8"),
    ("nul-byte", b"a,b,y\n1,2,0\n3,\x004,1\n", {}, r": line 3: a NUL byte; not a text CSV file \(a binary file\?\)"),
    ("quote-never-closed", HEADER + '1,2,0\n3,4,"cat\n5,6,dog\n7,8,cat\n', {},
     r": line 3: a quoted field opened on this line is never closed"),
    ("quote-never-closed-in-a-large-file", HEADER + '1,2,"x\n' + "3,4,1\n" * 30000, {},
     r": line 2: a field longer than 131072 characters \(a quote that is never closed\?\)"),
    ("stray-quote", HEADER + '1,2,0\n3,"4"x,1\n', {}, r": line 3: malformed quoting \(.*\); a quote inside .*"),
    ("text-feature", HEADER + "1,2,0\n3,red,1\n", {},
     r": line 3, column 'b': 'red' is not a number; feature columns must be numeric \(data.label_column names the "
     r"label\)"),
    ("decimal-comma", HEADER + '1,"2,5",0\n', {},
     r": line 2, column 'b': '2,5' is not a number \(a decimal comma\? write 1.5, not 1,5\); feature columns .*"),
    ("nan-feature", HEADER + "1,2,0\nnan,4,1\n", {},
     r": line 3, column 'a': 'nan' is not finite \(a missing value\?\); feature cells must be finite numbers"),
    ("feature-beyond-float32", HEADER + "1,2,0\n3,1e39,1\n", {},
     r": line 3, column 'b': '1e39' is beyond float32's range \(±3.4e38\), where features are held"),
    ("regression-target-beyond-float32", HEADER + "1,2,0.5\n3,4,-5e40\n", {},
     r": line 3, column 'y': '-5e40' is beyond float32's range \(±3.4e38\)"),
    ("semicolon-separated", "a;b;y\n1;2;0\n3;4;1\n", {},
     r": line 1 has a single column; data.name=csv needs feature columns and a label column, comma-separated \(it "
     r"seems to separate values with ';'; save it comma-separated\)"),
    ("line-numbers-count-blank-and-multiline-rows", HEADER + '1,2,"two\nlines"\n\n\n3,x,dog\n', {},
     r": line 6, column 'b': 'x' is not a number; .*"),
]


@pytest.mark.parametrize(("text", "fields", "pattern"), [c[1:] for c in CSV_ERRORS], ids=[c[0] for c in CSV_ERRORS])
def test_csv_refused_naming_line_and_column(tmp_path: Path, text: str | bytes, fields: dict, pattern: str) -> None:
    path = tmp_path / "table.csv"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    _raises(lambda: _build("csv", path, **fields), path, pattern)


def _read(tmp_path: Path, text: str | bytes, **fields: Any) -> tuple[torch.Tensor, torch.Tensor, DataBundle]:
    path = tmp_path / "table.csv"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    bundle = _build("csv", path, val_fraction=0.0, test_fraction=0.0, normalize=False, **fields)
    order = bundle.train.inputs[:, 0].argsort()  # rows back in file order (column a rises)
    return bundle.train.inputs[order], bundle.train.targets[order], bundle


def _expected(n: int = 30, label: Callable[[int], object] = lambda i: i % 3) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([[i + 0.5, 2.0 * i] for i in range(n)])
    return x, torch.tensor([label(i) for i in range(n)])


CSV_READINGS = [
    ("utf8-bom-headerless-keeps-all-200-rows", "\ufeff" + _rows(200), {}, 200),
    ("utf8-bom-before-header", "\ufeffa,b,y\n" + _rows(), {"label_column": "y"}, 30),
    ("windows-line-endings", (HEADER + _rows()).replace("\n", "\r\n"), {}, 30),
    ("old-mac-line-endings", (HEADER + _rows()).replace("\n", "\r"), {}, 30),
    ("trailing-empty-lines-and-separator-rows", HEADER + _rows() + "\n\n,,\n\n", {}, 30),
    ("separator-at-end-of-every-line", (HEADER + _rows()).replace("\n", ",\n"), {}, 30),
    ("spaces-around-cells", HEADER + "".join(f" {i}.5 , {i * 2} ,  {i % 3} \n" for i in range(30)), {}, 30),
]


@pytest.mark.parametrize(("text", "fields", "n"), [c[1:] for c in CSV_READINGS], ids=[c[0] for c in CSV_READINGS])
def test_csv_read_as_meant(tmp_path: Path, text: str, fields: dict, n: int) -> None:
    inputs, targets, bundle = _read(tmp_path, text, **fields)
    x, y = _expected(n)
    assert bundle.spec.task == "classification" and bundle.spec.num_classes == 3
    assert torch.equal(inputs, x) and torch.equal(targets, y)


def test_csv_quoted_fields_hold_commas_quotes_and_newlines(tmp_path: Path) -> None:
    labels = ['"big, red"', '"say ""hi"""', '"two\nlines"']
    text = HEADER + "".join(f'"{i}.5",{i * 2},{labels[i % 3]}\n' for i in range(30))
    inputs, targets, bundle = _read(tmp_path, text)
    x, _ = _expected()
    # class names sorted: 'big, red' < 'say "hi"' < 'two\nlines'
    assert torch.equal(inputs, x) and targets.tolist() == [i % 3 for i in range(30)]
    assert bundle.spec.num_classes == 3


def test_csv_one_and_one_point_zero_are_one_class(tmp_path: Path) -> None:
    _, targets, bundle = _read(tmp_path, HEADER + _rows(30, lambda i: ["1", "1.0", "01", "2", "2.00"][i % 5]))
    assert bundle.spec.num_classes == 2 and targets.tolist() == [[0, 0, 0, 1, 1][i % 5] for i in range(30)]


def test_csv_all_unique_floats_are_a_regression(tmp_path: Path) -> None:
    _, targets, bundle = _read(tmp_path, HEADER + _rows(30, lambda i: f"{0.37 * i:.2f}"))
    assert bundle.spec.task == "regression" and bundle.spec.num_classes is None
    assert torch.equal(targets, torch.tensor([[float(f"{0.37 * i:.2f}")] for i in range(30)]))


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_csv_unique_whole_numbers_follow_an_explicit_task(tmp_path: Path, task: str) -> None:
    _, targets, bundle = _read(tmp_path, HEADER + _rows(40, lambda i: 100 + 7 * i), task=task)
    assert bundle.spec.task == task
    if task == "regression":
        assert torch.equal(targets, torch.tensor([[100.0 + 7 * i] for i in range(40)]))
    else:
        assert bundle.spec.num_classes == 40 and targets.tolist() == list(range(40))


def test_csv_a_numeric_target_of_mostly_whole_numbers_is_a_regression(tmp_path: Path) -> None:
    """Ratings in half steps, or counts with some fractions: more than a stray cell is a target."""
    labels = lambda i: ["1", "2", "3", "2.5", "4", "5", "1", "3", "4.5", "2"][i % 10]  # noqa: E731
    _, targets, bundle = _read(tmp_path, HEADER + _rows(40, labels))
    assert bundle.spec.task == "regression"
    assert targets[:, 0].tolist() == [float(labels(i)) for i in range(40)]


def test_csv_a_stray_fraction_follows_an_explicit_regression(tmp_path: Path) -> None:
    _, targets, bundle = _read(tmp_path, HEADER + _rows(199, lambda i: i % 2) + "1,2,1.5\n", task="regression")
    assert bundle.spec.task == "regression" and sorted(set(targets[:, 0].tolist())) == [0.0, 1.0, 1.5]


def test_csv_pandas_index_column_is_a_named_feature(tmp_path: Path) -> None:
    text = ",a,b,y\n" + "".join(f"{i},{i}.5,{i * 2},{i % 3}\n" for i in range(30))
    path = tmp_path / "table.csv"
    path.write_text(text)
    bundle = _build("csv", path, val_fraction=0.0, test_fraction=0.0, normalize=False)
    assert bundle.spec.input_shape == (3,) and bundle.spec.num_classes == 3 and len(bundle.train) == 30
    with pytest.raises(ConfigError, match=r"columns: column_0, a, b, y"):
        _build("csv", path, label_column="nope")


# ----------------------------------------------------------------------------- tokens (uint16 .bin)
def test_token_id_beyond_vocab_size_names_the_largest_id(tmp_path: Path) -> None:
    tokens = np.full(4000, 7, dtype=np.uint16)
    tokens[1234], tokens[3000] = 50257, 50300
    tokens.tofile(tmp_path / "train.bin")
    _raises(lambda: _build("tokens", tmp_path / "train.bin", seq_len=32, vocab_size=50257), tmp_path / "train.bin",
            r": holds token id 50300 \(largest; the first id >= 50257 is at token 1234\), but data.vocab_size = 50257 "
            r"allows ids 0..50256; set data.vocab_size to at least 50301, or leave it unset to size it from the files")


def test_validation_file_with_another_vocabulary_is_named(tmp_path: Path) -> None:
    write_tokens(tmp_path / "train.bin", 2000, vocab=50)
    val = np.arange(400, dtype=np.uint16) % 300  # tokenised with a larger vocabulary
    val.tofile(tmp_path / "val.bin")
    _raises(lambda: _build("tokens", tmp_path, seq_len=16, vocab_size=50), tmp_path / "val.bin",
            r": holds token id 299 \(largest; the first id >= 50 is at token 50\), but data.vocab_size = 50 allows ids "
            r"0..49; .*")
    # left unset, the vocabulary covers both files, and every id trains
    assert _build("tokens", tmp_path, seq_len=16).spec.vocab_size == 300


def test_vocab_size_exactly_largest_id_plus_one_is_accepted(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", 1000, vocab=50)
    largest = int(np.fromfile(path, dtype=np.uint16).max())
    assert _build("tokens", path, seq_len=16, vocab_size=largest + 1).spec.vocab_size == largest + 1
    _raises(lambda: _build("tokens", path, seq_len=16, vocab_size=largest), path,
            rf": holds token id {largest} \(largest; .*")


@pytest.mark.parametrize("dtype, bits", [(np.int32, 32), (np.uint32, 32), (np.int64, 64)])
def test_wider_integer_token_files_are_refused(tmp_path: Path, dtype: type, bits: int) -> None:
    path = tmp_path / "train.bin"
    (np.arange(3000) % 200 + 1).astype(dtype).tofile(path)  # np.array(ids).tofile() writes int64
    _raises(lambda: _build("tokens", path, seq_len=16), path,
            rf": every second 16-bit value is 0: these look like {bits}-bit token ids, but token files hold uint16 ids "
            r"\(write them with np.array\(ids, dtype=np.uint16\).tofile\(...\)\)")


@pytest.mark.parametrize("size, pattern", [
    (0, r": 0 tokens, fewer than one window of data.seq_len \+ 1 = 17"),
    (33, r": odd byte count \(33\): not a flat array of uint16 token ids"),
    (32, r": 16 tokens, fewer than one window of data.seq_len \+ 1 = 17"),
])
def test_token_file_size_problems(tmp_path: Path, size: int, pattern: str) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(b"\x03\x00" * (size // 2) + b"\x01" * (size % 2))
    _raises(lambda: _build("tokens", path, seq_len=16), path, pattern)


def test_validation_file_shorter_than_a_window(tmp_path: Path) -> None:
    write_tokens(tmp_path / "train.bin", 2000)
    write_tokens(tmp_path / "val.bin", 10)
    _raises(lambda: _build("tokens", tmp_path, seq_len=16), tmp_path / "val.bin",
            r": 10 tokens, fewer than one window of data.seq_len \+ 1 = 17")


def test_token_file_changed_under_a_run_fails_naming_the_sample(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "t.bin", 1000, vocab=50)
    train = _build("tokens", path, seq_len=16, vocab_size=50, val_fraction=0.0, test_fraction=0.0).train
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[16 * 3 + 5] = 60000  # rewritten after the load-time check
    tokens.tofile(path)
    item = guarded_collate([GuardedDataset(train)[i] for i in (2, 3)])
    with pytest.raises(BadSample) as err:
        unwrap(item, "fail", "train")
    assert str(err.value) == (f"train split: sample 3: ValueError: {path}: token id 60000 >= data.vocab_size = 50; "
                              "set data.on_error=skip to skip unreadable samples")


# ----------------------------------------------------------------------------- text
def test_text_vocab_size_smaller_than_its_characters(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("abcdefghij" * 50)
    _raises(lambda: _build("text", path, seq_len=8, vocab_size=5), path,
            r": 10 distinct characters \(ids 0..9, the largest 'j'\), more than data.vocab_size = 5; text gives each "
            r"character an id: leave data.vocab_size unset, or at least the number of distinct characters")
    assert _build("text", path, seq_len=8, vocab_size=10).spec.vocab_size == 10


def test_text_byte_order_mark_and_crlf_are_not_characters(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbf" + b"ab\r\ncd\r\n" * 100)
    bundle = _build("text", path, seq_len=8, val_fraction=0.0, test_fraction=0.0)
    assert bundle.spec.vocab_size == 5  # \n a b c d: no BOM, no \r
    assert bundle.train.inputs[0].tolist() == [1, 2, 0, 3, 4, 0, 1, 2]


def test_text_not_utf8_names_byte_and_line(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"first line\nsecond caf\xe9\n")
    _raises(lambda: _build("text", path), path,
            r": not UTF-8 text \(byte 21, line 2\); data.name=text reads UTF-8 .txt files")


# ----------------------------------------------------------------------------- MNIST (IDX)
def _mnist(tmp_path: Path, train_labels: np.ndarray | None = None, test_labels: np.ndarray | None = None) -> Path:
    write_mnist(tmp_path, n_train=40, n_test=20)
    if train_labels is not None:
        write_idx(tmp_path / "train-labels-idx1-ubyte", train_labels)
    if test_labels is not None:
        write_idx(tmp_path / "t10k-labels-idx1-ubyte", test_labels)
    return tmp_path


def test_mnist_stray_label_would_add_classes(tmp_path: Path) -> None:
    labels = mnist_like(40, seed=0)[1].copy()
    labels[17] = 255
    _mnist(tmp_path, train_labels=labels)
    _raises(lambda: _build("mnist", tmp_path), tmp_path / "train-labels-idx1-ubyte",
            r": label 255 at item 17, but labels 10, 11, 12, 13, 14 ... never occur: not the labels of 256 classes "
            r"\(a damaged file\?\)")


def test_mnist_test_label_unknown_to_training(tmp_path: Path) -> None:
    train = np.arange(40, dtype=np.uint8) % 5
    test = np.arange(20, dtype=np.uint8) % 5
    test[6] = 7
    _mnist(tmp_path, train_labels=train, test_labels=test)
    _raises(lambda: _build("mnist", tmp_path), tmp_path / "t10k-labels-idx1-ubyte",
            r": label 7 at item 6 never occurs in the training labels \(train-labels-idx1-ubyte: 0, 1, 2, 3, 4\)")


def test_mnist_emnist_letters_counting_from_one_are_read(tmp_path: Path) -> None:
    _mnist(tmp_path, train_labels=np.arange(40, dtype=np.uint8) % 26 + 1, test_labels=np.full(20, 3, np.uint8))
    assert _build("mnist", tmp_path).spec.num_classes == 27


def test_mnist_train_and_test_image_sizes_differ(tmp_path: Path) -> None:
    _mnist(tmp_path)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", mnist_like(20, seed=1, size=32)[0])
    _raises(lambda: _build("mnist", tmp_path), tmp_path / "t10k-images-idx3-ubyte",
            r": images are 32 x 32, but the training images \(train-images-idx3-ubyte\) are 28 x 28")


def test_mnist_header_of_zero_items(tmp_path: Path) -> None:
    _mnist(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((0, 28, 28), np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(0, np.uint8))
    _raises(lambda: _build("mnist", tmp_path), tmp_path / "train-images-idx3-ubyte",
            r": holds no items \(its header says 0\)")


def test_mnist_corrupt_gzip_stream(tmp_path: Path) -> None:
    write_mnist(tmp_path, n_train=40, n_test=20, gz=True)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    data = bytearray(gzip.compress(bytes(range(256)) * 200))
    data[40:60] = b"\xff" * 20  # damaged deflate stream: zlib.error, not OSError
    path.write_bytes(bytes(data))
    _raises(lambda: _build("mnist", tmp_path), path, r": cannot read: .*")


def test_mnist_forged_dimensions_cannot_overflow(tmp_path: Path) -> None:
    _mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    header = (0x0803).to_bytes(4, "big") + (2**32 - 1).to_bytes(4, "big") + (2**32 - 1).to_bytes(4, "big")
    path.write_bytes(header + (2**32 - 1).to_bytes(4, "big") + b"\x00" * 100)
    _raises(lambda: _build("mnist", tmp_path), path,
            rf": 116 bytes, but its header \(4294967295 x 4294967295 x 4294967295\) needs {16 + (2**32 - 1) ** 3}")


# ----------------------------------------------------------------------------- image folders: load time
def _corrupt(path: Path, how: str = "garbage") -> Path:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:60])
    else:
        path.write_bytes(b"\x89PNG\r\n\x1a\n not an image at all")
    return path


def test_corrupt_training_image_fails_before_training_naming_file_and_split(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=6)
    bad = _corrupt(tmp_path / "class_1" / "img_4.png")
    _raises(lambda: _build("image_folder", tmp_path, image_size=8, on_error="fail"), bad,
            r": cannot decode image: cannot identify image file '.*img_4.png' \(train split, sample \d+, read for "
            r"data.normalize's statistics before training; set data.on_error=skip to skip unreadable images\)")


def test_corrupt_training_image_with_skip_is_left_out_of_the_statistics(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=6)
    bad = _corrupt(tmp_path / "class_0" / "img_2.png", "truncated")
    bundle = _build("image_folder", tmp_path, image_size=8, on_error="skip", val_fraction=0.0, test_fraction=0.0)
    files = bundle.train.files
    assert str(bad) in files and len(files) == 12  # still a sample: training meets it, skips and counts it
    good = torch.stack([decode_image(f, (8, 8)) for f in files if f != str(bad)]).double() / 255
    mean = good.transpose(0, 1).flatten(1).mean(dim=1)
    assert bundle.spec.pixel_mean is not None
    torch.testing.assert_close(torch.tensor(bundle.spec.pixel_mean, dtype=torch.float64), mean)


def test_no_decodable_image_for_the_statistics(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=2)
    for path in tmp_path.glob("class_*/*.png"):
        path.write_bytes(path.read_bytes()[:70])  # headers intact, pixel data cut
    with pytest.raises(DataError) as err:
        _build("image_folder", tmp_path, image_size=8, on_error="skip", val_fraction=0.0, test_fraction=0.0)
    message = str(err.value)
    assert re.fullmatch(r"train split: none of the 4 images read for data.normalize's statistics can be decoded, "
                        rf"e.g. {re.escape(str(tmp_path))}/class_\d/img_\d.png: cannot decode image: .*", message)


def test_class_folder_without_image_files(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=3)
    (tmp_path / "zebra").mkdir()
    (tmp_path / "zebra" / "README.md").write_text("images to come")
    _raises(lambda: _build("image_folder", tmp_path), tmp_path / "zebra",
            r": class folder holds no images \(\.bmp, .*\)")


def test_class_folder_with_no_readable_image(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=3, per_class=3)
    for path in (tmp_path / "class_2").iterdir():
        path.write_bytes(b"<html>404 Not Found</html>")  # a scraper saved error pages
    _raises(lambda: _build("image_folder", tmp_path), tmp_path / "class_2",
            r": none of its 3 images can be read \(e.g. .*class_2/img_0.png: cannot identify image file .*\); a class "
            r"without a readable image cannot be learned")


def test_validation_class_unknown_to_training(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "train", classes=2, per_class=3)
    write_image_folder(tmp_path / "val", classes=2, per_class=2)
    (tmp_path / "val" / "class_1").rename(tmp_path / "val" / "Class_1")
    _raises(lambda: _build("image_folder", tmp_path), tmp_path / "val" / "Class_1",
            r": class 'Class_1' is not among the training classes \(class_0, class_1\)")


def test_split_folders_without_class_folders(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "x", classes=1, per_class=3)
    (tmp_path / "x" / "class_0").rename(tmp_path / "train")
    write_image_folder(tmp_path / "y", classes=1, per_class=2)
    (tmp_path / "y" / "class_0").rename(tmp_path / "val")
    (tmp_path / "x").rmdir(), (tmp_path / "y").rmdir()
    _raises(lambda: _build("image_folder", tmp_path), tmp_path / "train",
            r": no class folders; with train/, val/ as splits, each needs one sub-folder of images per class "
            r"\(train/<class>/...\)")


def test_two_validation_folders(tmp_path: Path) -> None:
    write_image_folder(tmp_path / "train", classes=2, per_class=3)
    write_image_folder(tmp_path / "val", classes=2, per_class=2)
    write_image_folder(tmp_path / "validation", classes=2, per_class=2)
    _raises(lambda: _build("image_folder", tmp_path), tmp_path,
            r": both val/ and validation/ exist; keep one validation folder \(otherwise one of them would be silently "
            r"ignored\)")


def test_a_single_class_folder(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=1, per_class=6)
    _raises(lambda: _build("image_folder", tmp_path), tmp_path,
            r": one class folder \('class_0'\); classification needs at least two classes")


def test_images_in_sub_folders_and_odd_suffixes_are_read(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=2, per_class=3)
    (tmp_path / "class_1" / "batch2").mkdir()
    pixels = np.full((9, 9, 3), 200, dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "class_1" / "batch2" / "deep.png")
    Image.fromarray(pixels).save(tmp_path / "class_0" / "upper.PNG")
    Image.fromarray(pixels).save(tmp_path / "class_0" / "photo.jfif", format="JPEG")
    (tmp_path / "class_0" / ".DS_Store").write_bytes(b"\x00\x01")
    (tmp_path / "class_1" / "batch2" / "loop").symlink_to(tmp_path / "class_1")  # read once, not forever
    bundle = _build("image_folder", tmp_path, image_size=8, val_fraction=0.0, test_fraction=0.0, normalize=False)
    files = [Path(f).name for f in bundle.train.files]
    assert len(files) == 9 and {"deep.png", "upper.PNG", "photo.jfif"} <= set(files) and ".DS_Store" not in files


def test_sixteen_bit_png_is_scaled_not_clipped_white(tmp_path: Path) -> None:
    ramp = (np.arange(16 * 16, dtype=np.uint32).reshape(16, 16) * 256).astype(np.uint16)  # 0 .. 65280
    Image.fromarray(ramp).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode == "I;16"
    image = decode_image(str(tmp_path / "deep.png"), (16, 16))
    expected = torch.from_numpy(np.rint(ramp * (255 / 65535)).astype(np.uint8))
    assert torch.equal(image[0], expected) and torch.equal(image[1], expected)


# ----------------------------------------------------------------------------- mid-run: the guard in evaluation
def _evaluator(on_error: str, num_classes: int = 2) -> Evaluator:
    """An Evaluator as build.py makes one for a one-process classification run."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, num_classes))
    task = Task("classification", nn.functional.cross_entropy, num_classes=num_classes)
    return Evaluator(model, model, EvalSpec(task, ["accuracy", "loss"], contextlib.nullcontext),
                     eval_layout(DistContext(), torch.device("cpu"), 4),
                     batch_transform=lambda b: (b[0].float() / 255, b[1]), on_error=on_error)


def _split_with_bad(tmp_path: Path, split: str, bad: int = 1) -> tuple[DataBundle, list[Path]]:
    write_image_folder(tmp_path / "train", classes=2, per_class=4)
    write_image_folder(tmp_path / split, classes=2, per_class=3, fmt="jpg")
    broken = [_corrupt(tmp_path / split / f"class_{k % 2}" / f"img_{1 + k // 2}.jpg", "truncated") for k in range(bad)]
    return _build("image_folder", tmp_path, image_size=8, normalize=False), broken


@pytest.mark.parametrize("split", ["val", "test"])
def test_corrupt_held_out_image_fails_naming_split_and_file(tmp_path: Path, split: str) -> None:
    bundle, (bad,) = _split_with_bad(tmp_path, split)
    data = bundle.val if split == "val" else bundle.test
    assert data is not None
    with pytest.raises(BadSample) as err:
        _evaluator("fail").evaluate(data, split)
    assert re.fullmatch(rf"{split} split: sample \d \(file {re.escape(str(bad))}\): ImageDecodeError: "
                        rf"{re.escape(str(bad))}: cannot decode image: .*; set data.on_error=skip to skip unreadable "
                        r"samples", str(err.value)), str(err.value)


def test_corrupt_held_out_images_with_skip_are_left_out_and_counted(tmp_path: Path, warned: list[str]) -> None:
    bundle, broken = _split_with_bad(tmp_path, "val", bad=2)
    assert bundle.val is not None
    evaluator = _evaluator("skip")
    metrics = evaluator.evaluate(bundle.val, "val").metrics
    assert evaluator.skipped == {"val": 2} and set(metrics) == {"accuracy", "loss"}
    # the figures are those of the 4 readable samples alone
    readable = [i for i, f in enumerate(bundle.val.files) if Path(f) not in broken]
    reference = _evaluator("fail")
    reference.model.load_state_dict(evaluator.model.state_dict())
    assert metrics == pytest.approx(reference.evaluate(bundle.val.subset(readable), "val").metrics, rel=1e-6)
    evaluator.evaluate(bundle.val, "val")
    assert evaluator.skipped == {"val": 2}  # per evaluation, not summed over them
    assert len(warned) == 1
    assert warned[0].startswith("val split: left out 2 unreadable samples (data.on_error=skip), e.g. sample ")


def test_held_out_split_with_no_readable_image_under_skip(tmp_path: Path) -> None:
    bundle, _ = _split_with_bad(tmp_path, "test", bad=0)
    assert bundle.test is not None
    for f in bundle.test.files:
        _corrupt(Path(f), "truncated")
    with pytest.raises(BadSample, match=r"^test split: all 6 samples are unreadable \(data.on_error=skip\): nothing "
                                        r"to evaluate$"):
        _evaluator("skip").evaluate(bundle.test, "test")


def test_an_evaluation_share_names_the_file_of_the_split(tmp_path: Path) -> None:
    bundle, (bad,) = _split_with_bad(tmp_path, "val")
    assert bundle.val is not None
    index = bundle.val.files.index(str(bad))
    share = shard_for_eval(bundle.val, index % 2, 2)  # a DDP rank's share: a Subset of the split
    item = guarded_collate([GuardedDataset(share)[i] for i in range(len(share))])
    with pytest.raises(BadSample, match=rf"^val split: sample {index} \(file {re.escape(str(bad))}\): "):
        unwrap(item, "fail", "val")


# ----------------------------------------------------------------------------- mid-run: through the Trainer
def _overrides(root: Path, on_error: str, **more: Any) -> dict[str, Any]:
    return {"data.name": "image_folder", "data.path": str(root), "data.image_size": 8, "model.name": "mlp",
            "model.hidden_sizes": [8], "train.epochs": 1, "train.batch_size": 4, "train.device": "cpu",
            "log.progress": "none", "log.tensorboard": False, "data.on_error": on_error, "checkpoint.enabled": False,
            "data.num_workers": 0, "data.normalize": False, **more}


def test_trainer_fails_on_a_corrupt_validation_image_naming_split_file_and_step(tmp_path: Path) -> None:
    from gputrain.train.trainer import Trainer

    _, (bad,) = _split_with_bad(tmp_path / "data", "val")
    run_dir = tmp_path / "run"
    trainer = Trainer.from_config(None, run_dir=run_dir, overrides=_overrides(tmp_path / "data", "fail"))
    with pytest.raises(RunError) as err:
        trainer.fit()
    message = str(err.value)
    assert "\n" not in message and re.fullmatch(
        # 2 steps, then the validation (the trainer names it 'step 3' or 'the val evaluation after step 2')
        r"training failed at (?:step 3|the val evaluation after step 2): BadSample: val split: sample \d "
        rf"\(file {re.escape(str(bad))}\): ImageDecodeError: .*; set data.on_error=skip to skip unreadable samples "
        rf"\(traceback in {re.escape(str(run_dir))}/error.log\)", message), message
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "val split" in summary["error"] and str(bad) in summary["error"]
    assert (run_dir / "error.log").is_file()


def test_trainer_fails_on_a_corrupt_training_image_mid_run_naming_split_file_and_step(tmp_path: Path) -> None:
    from gputrain.train.trainer import Trainer

    write_image_folder(tmp_path / "data", classes=2, per_class=4)
    bad = _corrupt(tmp_path / "data" / "class_1" / "img_2.png", "truncated")
    trainer = Trainer.from_config(None, run_dir=tmp_path / "run", overrides=_overrides(
        tmp_path / "data", "fail", **{"data.val_fraction": 0.0, "data.test_fraction": 0.0}))
    with pytest.raises(RunError, match=rf"^training failed at step [12]: BadSample: train split: sample \d \(file "
                                       rf"{re.escape(str(bad))}\): ImageDecodeError: "):
        trainer.fit()


def test_trainer_skips_corrupt_held_out_images_when_asked(tmp_path: Path) -> None:
    from gputrain.train.trainer import Trainer

    _split_with_bad(tmp_path / "data", "val")
    _corrupt(tmp_path / "data" / "train" / "class_0" / "img_3.png", "truncated")
    trainer = Trainer.from_config(None, run_dir=tmp_path / "run", overrides=_overrides(tmp_path / "data", "skip"))
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["data"]["skipped_samples"] == 1
    assert trainer.parts.evaluator.skipped == {"val": 1} and set(summary["val"]) >= {"accuracy", "loss"}
    assert summary["data"]["eval_skipped_samples"] == {"val": 1}


# ----------------------------------------------------------------------------- the real command
@pytest.mark.slow
@pytest.mark.parametrize("case", ["csv-nan-label", "csv-headerless-missing", "tokens-beyond-vocab", "corrupt-image"])
def test_cli_exit_2_one_line_no_traceback(tmp_path: Path, case: str) -> None:
    if case == "csv-nan-label":
        path = tmp_path / "t.csv"
        path.write_text(HEADER + _rows(20) + "1,2,nan\n")
        args, words = ["data.name=csv", f"data.path={path}"], [f"{path}: line 22, column 'y': 'nan' is a missing-value"]
    elif case == "csv-headerless-missing":
        path = tmp_path / "t.csv"
        path.write_text("1,,0\n" + _rows(199))
        args, words = ["data.name=csv", f"data.path={path}"], [f"{path}: line 1, column 'column_1': empty"]
    elif case == "tokens-beyond-vocab":
        path = tmp_path / "train.bin"
        (np.arange(3000) % 120).astype(np.uint16).tofile(path)
        args = ["data.name=tokens", f"data.path={path}", "data.vocab_size=100", "model.name=gpt", "data.seq_len=16"]
        words = [f"{path}: holds token id 119", "data.vocab_size = 100"]
    else:
        write_image_folder(tmp_path / "images", classes=2, per_class=4)
        path = _corrupt(tmp_path / "images" / "class_0" / "img_1.png")
        args = ["data.name=image_folder", f"data.path={tmp_path / 'images'}", "data.image_size=8"]
        words = [f"{path}: cannot decode image", "train split"]
    result = run_cli("train", "--run-dir", str(tmp_path / "run"), *args, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert all(word in lines[0] for word in words), lines[0]
    run = tmp_path / "run"
    assert not run.exists() or not any(run.iterdir()), "nothing may be written before the input is checked"
