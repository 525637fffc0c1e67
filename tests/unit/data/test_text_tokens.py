"""text (characters) and tokens (uint16 memmap): windows, splits, vocabularies, bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.errors import ConfigError, DataError
from tests.unit.data.files import write_tokens


def _build(name: str, path: Path, **fields: object):  # type: ignore[no-untyped-def]
    config = load_config({"data.name": name, "data.path": str(path), **{f"data.{k}": v for k, v in fields.items()}})
    return build_data(config.data, seed=0)


# ----------------------------------------------------------------------------- text
def test_text_windows_are_consecutive_and_shifted(tmp_path: Path) -> None:
    text = "".join(chr(ord("a") + (i * 7) % 26) for i in range(1001))
    (tmp_path / "t.txt").write_text(text)
    bundle = _build("text", tmp_path / "t.txt", seq_len=10, val_fraction=0.1, test_fraction=0.1)
    vocab = sorted(set(text))
    assert bundle.spec.task == "lm" and bundle.spec.vocab_size == 26 and bundle.spec.input_shape == (10,)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (80, 10, 10)
    decode = lambda ids: "".join(vocab[i] for i in ids.tolist())  # noqa: E731
    x, y = bundle.train[3]
    assert decode(x) == text[30:40] and decode(y) == text[31:41]
    # contiguous split: validation is the text right after the training windows
    assert decode(bundle.val[0][0]) == text[800:810]
    assert decode(bundle.test[9][1]) == text[991:1001]


def test_text_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "short.txt").write_text("hello")
    with pytest.raises(DataError, match=r"short.txt: too short for data.seq_len=32"):
        _build("text", tmp_path / "short.txt", seq_len=32)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt: not UTF-8 text \(byte 3, line 1\)"):
        _build("text", tmp_path / "latin1.txt")
    with pytest.raises(DataError, match=r"data.path: no such file: .*missing.txt"):
        _build("text", tmp_path / "missing.txt")


# ----------------------------------------------------------------------------- tokens
def test_token_window_i_is_the_file_at_i_times_seq_len(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "train.bin", 1000, vocab=300)
    tokens = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    bundle = _build("tokens", path, seq_len=16, val_fraction=0.1, test_fraction=0.0)
    windows = (1000 - 1) // 16
    assert len(bundle.train) + len(bundle.val) == windows and bundle.test is None
    assert bundle.spec.vocab_size == tokens.max() + 1  # scanned: no vocab_size given
    for i in (0, 5, len(bundle.train) - 1):
        x, y = bundle.train[i]
        assert x.dtype == torch.int64
        assert torch.equal(x, torch.from_numpy(tokens[16 * i:16 * i + 16]))
        assert torch.equal(y, torch.from_numpy(tokens[16 * i + 1:16 * i + 17]))
    first_val = len(bundle.train)
    assert torch.equal(bundle.val[0][0], torch.from_numpy(tokens[16 * first_val:16 * first_val + 16]))


def test_separate_validation_file_and_folder_layout(tmp_path: Path) -> None:
    write_tokens(tmp_path / "train.bin", 2000)
    write_tokens(tmp_path / "val.bin", 330, seed=1)
    for path, extra in ((tmp_path, {}), (tmp_path / "train.bin", {}),
                        (tmp_path / "train.bin", {"val_path": str(tmp_path / "val.bin")})):
        bundle = _build("tokens", path, seq_len=32, vocab_size=50, **extra)
        assert (len(bundle.train), len(bundle.val), bundle.test) == (1999 // 32, 329 // 32, None)
        assert bundle.val.path == tmp_path / "val.bin"
        assert bundle.spec.vocab_size == 50


def test_max_eval_samples_spreads_over_the_split(tmp_path: Path) -> None:
    write_tokens(tmp_path / "train.bin", 100)
    write_tokens(tmp_path / "val.bin", 40 * 8 + 1, seed=1)
    val = _build("tokens", tmp_path, seq_len=8, max_eval_samples=4).val
    assert len(val) == 4
    tokens = np.fromfile(tmp_path / "val.bin", dtype=np.uint16).astype(np.int64)
    assert [int(val[i][0][0]) for i in range(4)] == [int(tokens[8 * w]) for w in (0, 10, 20, 30)]


def test_windows_survive_dataloader_workers(tmp_path: Path) -> None:
    # the memmap is opened per process, so workers get the path, not a pickled copy of the file
    train = _build("tokens", write_tokens(tmp_path / "t.bin", 4000), seq_len=32, val_fraction=0.0,
                   test_fraction=0.0, vocab_size=50).train
    loaded = next(iter(DataLoader(train, batch_size=8, num_workers=1)))
    assert torch.equal(loaded[0], torch.stack([train[i][0] for i in range(8)]))


def test_odd_byte_count_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x00" * 100 + b"\x07")
    with pytest.raises(DataError, match=rf"^{path}: odd byte count \(201\): not a flat array of uint16 token ids$"):
        _build("tokens", path, seq_len=8)


def test_missing_and_short_token_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=rf"^{tmp_path / 'nope.bin'}: no such token file"):
        _build("tokens", tmp_path / "nope.bin")
    write_tokens(tmp_path / "train.bin", 1000)
    with pytest.raises(DataError, match=rf"^{tmp_path / 'v.bin'}: no such token file"):
        _build("tokens", tmp_path / "train.bin", val_path=str(tmp_path / "v.bin"))
    short = write_tokens(tmp_path / "short.bin", 20)
    with pytest.raises(DataError, match=rf"^{short}: 20 tokens, fewer than one window of data.seq_len \+ 1 = 33$"):
        _build("tokens", short, seq_len=32)


def test_token_config_errors(tmp_path: Path) -> None:
    # (a prepared folder of uint32 ids has a larger vocabulary: checked where the path is known)
    with pytest.raises(ConfigError, match="data.vocab_size = 70000: token files hold uint16 ids"):
        _build("tokens", write_tokens(tmp_path / "train.bin", 100), vocab_size=70000)
    with pytest.raises(ConfigError, match="data.path: data.name=tokens needs a uint16 token file"):
        build_data(load_config({"data.name": "tokens"}).data, seed=0)
    with pytest.raises(ConfigError, match=r"data.image_size = \[1, 2, 3\]: must be a size > 0 or \[height, width\]"):
        load_config({"data.image_size": [1, 2, 3]})
