"""Data read with a changed meaning, or not at all (issue 13, second pass): text that is not UTF-8
(UTF-16/32, NUL bytes) and text given as token ids are errors naming the file and what it looks like;
a path that is there but is no regular file (a device, a FIFO, a folder) is named as what it is; and
data.on_error=skip holds when a whole micro-batch, or a whole step, cannot be read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.config.paths import check_data_path
from gputrain.data import build_data
from gputrain.data.guard import BadSample, GuardedBatch, unwrap
from gputrain.errors import ConfigError, DataError, RunError
from tests.conftest import run_cli

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40


def _text(tmp_path: Path, data: bytes, name: str = "t.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _build(name: str, path: Path | str, **fields: Any) -> Any:
    config = load_config({"data.name": name, "data.path": str(path), **{f"data.{k}": v for k, v in fields.items()}})
    return build_data(config.data, seed=0)


# ----------------------------------------------------------------------------- text that is not UTF-8 text
WIDE = [
    ("utf-16-le", TEXT.encode("utf-16-le"), "UTF-16-LE text, not UTF-8"),
    ("utf-16-be", TEXT.encode("utf-16-be"), "UTF-16-BE text, not UTF-8"),
    ("utf-16-bom", TEXT.encode("utf-16"), r"UTF-16-LE \(byte-order mark\) text, not UTF-8"),
    ("utf-16-be-bom", b"\xfe\xff" + TEXT.encode("utf-16-be"), r"UTF-16-BE \(byte-order mark\) text, not UTF-8"),
    ("utf-32-le", TEXT.encode("utf-32-le"), "UTF-32-LE text, not UTF-8"),
    ("utf-32-be", TEXT.encode("utf-32-be"), "UTF-32-BE text, not UTF-8"),
    ("utf-32-bom", TEXT.encode("utf-32"), r"UTF-32-LE \(byte-order mark\) text, not UTF-8"),
]


@pytest.mark.parametrize(("data", "pattern"), [w[1:] for w in WIDE], ids=[w[0] for w in WIDE])
def test_wide_unicode_text_is_named_as_such(tmp_path: Path, data: bytes, pattern: str) -> None:
    path = _text(tmp_path, data)
    with pytest.raises(DataError) as err:
        _build("text", path)
    assert re.fullmatch(re.escape(str(path)) + ": " + pattern + r"; data.name=text reads UTF-8 .txt files: convert "
                        r"it \(e.g. iconv -f UTF-\d\d-[LB]E -t UTF-8\)", str(err.value)), str(err.value)


@pytest.mark.parametrize(("data", "byte"), [
    (TEXT.encode()[:100] + b"\0" + TEXT.encode(), 100),
    (b"\0" + TEXT.encode(), 0),
    (TEXT.encode() + b"\0", len(TEXT.encode())),
    (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)) * 4, 8),
], ids=["middle", "first", "last", "png"])
def test_nul_bytes_are_binary_data_not_text(tmp_path: Path, data: bytes, byte: int) -> None:
    path = _text(tmp_path, data)
    line = data[:byte].count(b"\n") + 1
    with pytest.raises(DataError) as err:
        _build("text", path)
    assert str(err.value) == (f"{path}: a NUL byte at byte {byte} (line {line}): binary data, not text; data.name=text "
                              "reads UTF-8 .txt files (token ids in a .bin file: data.name=tokens)")


def test_utf8_text_with_a_bom_still_reads(tmp_path: Path) -> None:
    bundle = _build("text", _text(tmp_path, b"\xef\xbb\xbf" + TEXT.encode()), seq_len=16)
    assert bundle.spec.vocab_size == len(set(TEXT))


# ----------------------------------------------------------------------------- text given as token ids
TOKEN_TEXTS = [
    ("ascii", TEXT.encode()),
    ("utf-8-accents", ("Déjà vu, naïve café — " * 200).encode()),
    ("utf-8-cjk", ("機械学習のテキスト。" * 300).encode()),
    ("csv", ("a,b,label\n" + "".join(f"{i},{i * 2},{i % 3}\n" for i in range(300))).encode()),
    ("latin-1", ("Déjà vu, naïve café; " * 200).encode("latin-1")),
    ("cp1252-quotes", ("\u201cquoted\u201d text, on and on; " * 200).encode("cp1252")),
    ("form-feeds", ("page one\x0c\npage two\n" * 300).encode()),
    ("a-stray-byte", TEXT.encode()[:3000] + b"\xff" + TEXT.encode()[3000:]),
]


@pytest.mark.parametrize("data", [t[1] for t in TOKEN_TEXTS], ids=[t[0] for t in TOKEN_TEXTS])
def test_a_text_file_is_not_read_as_token_ids(tmp_path: Path, data: bytes) -> None:
    path = _text(tmp_path, data[: len(data) // 2 * 2], "train.bin")
    with pytest.raises(DataError) as err:
        _build("tokens", path, seq_len=16)
    message = str(err.value)
    assert message.startswith(f"{path}: looks like text (") and "not uint16 token ids" in message, message


@pytest.mark.parametrize(("ids", "vocab"), [
    (np.arange(4000) % 65, 65),  # nanoGPT's shakespeare_char: ids 0..64, newline is 0
    (np.arange(4000) % 256, 256),  # byte-level
    ((np.arange(4000) * 7919) % 50257, 50257),  # GPT-2's vocabulary
    (np.array([ord(c) for c in TEXT]), 128),  # characters as their code points: UTF-16 text, and meant so
], ids=["char-level", "byte-level", "gpt2", "code-points"])
def test_real_token_files_are_read(tmp_path: Path, ids: np.ndarray, vocab: int) -> None:
    path = tmp_path / "train.bin"
    ids.astype(np.uint16).tofile(path)
    bundle = _build("tokens", path, seq_len=16)
    assert bundle.spec.vocab_size <= vocab and len(bundle.train) > 0


# ----------------------------------------------------------------------------- paths that are there but no file
@pytest.mark.parametrize(("source", "path", "expected"), [
    ("csv", "/dev/zero", "data.path: /dev/zero is a character device, not a regular file"),
    ("text", "/dev/null", "data.path: /dev/null is a character device, not a regular file"),
    ("csv", "{tmp}", "data.path: {tmp} is a directory, not a regular file; data.name=csv reads one file"),
    ("text", "{tmp}", "data.path: {tmp} is a directory, not a regular file; data.name=text reads one file"),
    ("csv", "{fifo}", "data.path: {fifo} is a FIFO (named pipe), not a regular file"),
    ("image_folder", "{file}", "data.path: {file} is a regular file, not a folder; data.name=image_folder reads a "
                               "folder"),
    ("mnist", "/dev/zero", "data.path: /dev/zero is a character device, not a folder; data.name=mnist reads a folder"),
    ("tokens", "/dev/zero", "/dev/zero is a character device, not a regular file"),
    ("tokens", "{fifo}", "{fifo} is a FIFO (named pipe), not a regular file"),
    ("csv", "{missing}", "data.path: no such file: {missing}"),
], ids=["csv-dev-zero", "text-dev-null", "csv-dir", "text-dir", "csv-fifo", "images-file", "mnist-device",
        "tokens-device", "tokens-fifo", "csv-missing"])
def test_a_path_that_is_no_regular_file_is_named_as_what_it_is(tmp_path: Path, source: str, path: str,
                                                               expected: str) -> None:
    names = {"tmp": str(tmp_path), "fifo": str(tmp_path / "pipe"), "file": str(tmp_path / "f.txt"),
             "missing": str(tmp_path / "missing.csv")}
    import os

    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "f.txt").write_text("x")
    config = load_config({"data.name": source, "data.path": path.format(**names)})
    with pytest.raises(DataError) as err:
        check_data_path(config.data)
    assert str(err.value) == expected.format(**names)


@pytest.mark.parametrize("field", ["data.path", "data.val_path"])
def test_an_empty_data_path_is_a_config_error(tmp_path: Path, field: str) -> None:
    values = {"data.name": "tokens", "data.path": str(tmp_path), field: ""}
    with pytest.raises(ConfigError, match=rf"^config error: {re.escape(field)} = '': is empty; give the path"):
        check_data_path(load_config(values).data)


def test_the_cli_names_a_device_as_data_in_one_line(tmp_path: Path) -> None:
    result = run_cli("train", "--run-dir", str(tmp_path / "r"), "data.name=csv", "data.path=/dev/zero",
                     cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and result.stderr.strip() == (
        "gputrain train: data.path: /dev/zero is a character device, not a regular file"), result.stderr


# ----------------------------------------------------------------------------- skip holds for whole micro-batches
class Flaky(Dataset):
    """64 samples of 6 features; the ones in `bad` raise like a corrupt file would."""

    def __init__(self, bad: set[int]) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.bad = torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g), bad

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i in self.bad:
            raise OSError(f"sample {i}: unreadable")
        return self.x[i], self.y[i]


def _fit(bad: set[int], run_dir: Path, **config: Any) -> tuple[Trainer, dict[str, Any]]:
    torch.manual_seed(0)
    trainer = Trainer(nn.Linear(6, 3), Flaky(bad), loss_fn=F.cross_entropy, config={
        "train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.epochs": 2,
        "data.on_error": "skip", "data.num_workers": 0, "checkpoint.enabled": False, "train.batch_size": 1,
        "log.every_steps": 1, **config}, run_dir=run_dir)
    return trainer, trainer.fit()


@pytest.mark.parametrize(("bad", "batch", "accum"), [
    ({5}, 1, 1), ({0, 1, 2, 3, 4, 5}, 1, 1), (set(range(0, 64, 2)), 1, 1), ({0, 1}, 2, 1), ({0, 1, 2, 3}, 4, 2),
    ({7}, 2, 2), (set(range(32)), 4, 1),
], ids=["one", "six", "every-second", "whole-micro-batch", "whole-step-accum", "half-accum", "half-the-data"])
def test_skip_holds_when_whole_micro_batches_are_unreadable(tmp_path: Path, bad: set[int], batch: int, accum: int,
                                                            warned: list[str]) -> None:
    """Every sample of a micro-batch unreadable: the micro-batch is left out, and a step left with
    none makes no update; the run completes, counting every unreadable sample twice (2 epochs)."""
    trainer, summary = _fit(bad, tmp_path / "r", **{"train.batch_size": batch, "train.grad_accum": accum})
    assert summary["status"] == "completed", summary.get("error")
    assert summary["data"]["skipped_samples"] == 2 * len(bad)
    assert summary["global_step"] <= 2 * 64 // batch
    assert trainer.state.epoch == 2  # both epochs ran to their end
    empty_steps = summary["global_step"] < 2 * 64 // batch
    assert any("could be read (data.on_error=skip): it is left out" in w for w in warned) == empty_steps


def test_a_left_out_step_makes_no_update(tmp_path: Path) -> None:
    """With every sample unreadable but one, the model moves exactly as one step on that sample."""
    trainer, summary = _fit(set(range(1, 64)), tmp_path / "r", **{"train.epochs": 1, "optim.name": "sgd",
                                                                   "optim.lr": 0.1, "optim.momentum": 0.0,
                                                                   "optim.weight_decay": 0.0})
    assert summary["global_step"] == 1 and summary["data"]["skipped_samples"] == 63
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    x, y = Flaky(set())[0]
    F.cross_entropy(model(x[None]), y[None]).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad  # type: ignore[operator]
    assert not torch.equal(model.weight, nn.Linear(6, 3).weight)
    assert torch.allclose(model.weight, trainer.model.weight, atol=1e-7, rtol=0)


def test_a_split_with_no_readable_sample_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(RunError, match=r"BadSample: train split: none of its 64 samples could be read \(e\.g\. "
                                       r"sample \d+: OSError: sample \d+: unreadable\); check data.path"):
        _fit(set(range(64)), tmp_path / "r", **{"train.batch_size": 4})


def test_a_rank_of_several_cannot_leave_a_step_out_alone() -> None:
    item = GuardedBatch(None, [])
    from gputrain.data.guard import _Failed

    item.failed.append(_Failed("sample 3 (file a.png)", "OSError: bad"))
    assert unwrap(item, "skip", "train") == (None, 1)
    with pytest.raises(BadSample, match=r"^train split: sample 3 \(file a.png\): OSError: bad; every sample of this "
                                        r"rank's micro-batch was unreadable, and one rank of several cannot leave "
                                        r"out a step"):
        unwrap(item, "skip", "train", allow_empty=False)


@pytest.mark.slow
def test_the_probes_image_folder_with_empty_files_trains_under_skip(tmp_path: Path) -> None:
    """The probe's case: 6 empty .png files in an image folder, batch size 1, skip: it completes."""
    from tests.unit.data.files import write_image_folder

    write_image_folder(tmp_path / "images", classes=2, per_class=10)
    for i in range(6):
        (tmp_path / "images" / "class_0" / f"empty_{i}.png").write_bytes(b"")
    result = run_cli("train", "--run-dir", str(tmp_path / "r"), "data.name=image_folder",
                     f"data.path={tmp_path / 'images'}", "data.image_size=8", "model.name=cnn", "train.batch_size=1",
                     "train.epochs=2", "data.on_error=skip", "log.progress=none", "log.tensorboard=false",
                     "data.val_fraction=0", "data.test_fraction=0", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["data"]["skipped_samples"] == 12
