"""Prepared folders of token shards that are wrong (issue 30 §3, contract §3): a manifest that is not
JSON or not ours, of another version or dtype, with shard names that leave the folder, a shard that is
missing, truncated, overlong or not a file, counts that disagree, ids beyond the vocabulary, a
vocabulary or val file given against the manifest, shards from another tokenizer, a shard cut under
a running job. Each: one line naming the manifest or the shard and what would be right (DataError or
ConfigError; through `gputrain train`: exit 2, no traceback, nothing written)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.data import prepared as prepared_module
from gputrain.data.guard import BadSample, GuardedDataset, guarded_collate, unwrap
from gputrain.errors import ConfigError, DataError
from tests.conftest import run_cli
from tests.unit.data.prepared_files import TOKENIZER_HASH, edit_manifest, token_ids, write_prepared

M = "manifest.json"


def _folder(tmp_path: Path) -> Path:
    """Train in two shards (cut inside a window) and a val shard: a good folder the cases then spoil."""
    ids = token_ids(400)
    return write_prepared(tmp_path / "p", [ids[:150], ids[150:]], [token_ids(60, seed=1)])


def _build(folder: Path, **fields: Any) -> Any:
    config = load_config({"data.name": "tokens", "data.path": str(folder), "data.seq_len": 16,
                          **{f"data.{k}": v for k, v in fields.items()}})
    return build_data(config.data, seed=0)


def _set(*keys: str, value: Any) -> Callable[[Path], None]:
    def edit(m: dict) -> None:
        for key in keys[:-1]:
            m = m[key] if not key.isdigit() else m[int(key)]  # type: ignore[index]
        m[keys[-1] if not keys[-1].isdigit() else int(keys[-1])] = value  # type: ignore[index]

    return lambda folder: edit_manifest(folder, edit)


def _drop(*keys: str) -> Callable[[Path], None]:
    def edit(m: dict) -> None:
        for key in keys[:-1]:
            m = m[int(key)] if key.isdigit() else m[key]  # type: ignore[index]
        del m[keys[-1]]

    return lambda folder: edit_manifest(folder, edit)


def _write(text: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / M).write_bytes(text)


def _resize(file: str, size: Callable[[int], int]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / file
        os.truncate(path, size(path.stat().st_size))

    return edit


def _ids_at(file: str, position: int, value: int) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        ids = np.fromfile(folder / file, dtype=np.uint16)
        ids[position] = value
        ids.tofile(folder / file)

    return edit


def _replace_with_dir(file: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / file).unlink()
        (folder / file).mkdir()

    return edit


TRAIN0, TRAIN1, VAL0 = "train-00000.bin", "train-00001.bin", "val-00000.bin"
# (id, how the good folder is spoiled, what names itself (M or a shard file), the rest of the message: a regex)
CASES: list[tuple[str, Callable[[Path], None], str, str]] = [
    ("not-json", _write(b"{not json"), M, r": not a readable JSON manifest \(JSONDecodeError: .*\)"),
    ("not-utf8", _write(b"\xff\xfe{}"), M, r": not a readable JSON manifest \(UnicodeDecodeError: .*\)"),
    ("empty-file", _write(b""), M, r": not a readable JSON manifest \(JSONDecodeError: .*\)"),
    ("a-list", _write(b"[1, 2]"), M, r": not a gputrain prepared folder's manifest \(format 'list', expected "
                                      r"'gputrain-tokens'\); make the folder with `gputrain prepare`"),
    ("another-format", _set("format", value="litdata"), M,
     r": not a gputrain prepared folder's manifest \(format 'litdata', expected 'gputrain-tokens'\); .*"),
    ("no-format", _drop("format"), M, r": not a gputrain prepared folder's manifest \(format None, .*"),
    ("version-2", _set("version", value=2), M,
     r": manifest version 2; this gputrain reads version 1 \(prepare the corpus again with this version\)"),
    ("version-true", _set("version", value=True), M, r": manifest version True; this gputrain reads version 1 .*"),
    ("version-string", _set("version", value="1"), M, r": manifest version '1'; .*"),
    ("dtype-int64", _set("dtype", value="int64"), M, r": dtype 'int64'; a prepared folder holds uint16 or uint32 ids"),
    ("vocab-zero", _set("vocab_size", value=0), M, r": vocab_size 0; expected a count from 1 to 65536 for uint16 ids"),
    ("vocab-string", _set("vocab_size", value="50"), M, r": vocab_size '50'; expected a count .*"),
    ("vocab-beyond-uint16", _set("vocab_size", value=70000), M, r": vocab_size 70000; expected a count from 1 to "
                                                                  r"65536 for uint16 ids"),
    ("eos-beyond-vocab", _set("eos_id", value=50), M, r": eos_id 50; expected an id below vocab_size 50"),
    ("tokenizer-a-string", _set("tokenizer", value="bpe"), M, r": tokenizer must be an object with kind, hash and dir"),
    ("tokenizer-hash-a-number", _set("tokenizer", "hash", value=5), M, r": tokenizer.hash 5; expected 'sha256:<hex>'"),
    ("tokenizer-dir-out", _set("tokenizer", "dir", value=".."), M,
     r": tokenizer.dir '..'; expected a file name inside the prepared folder"),
    ("no-splits", _drop("splits"), M, r": splits.train is missing; the manifest lists each split's shards"),
    ("no-train", _drop("splits", "train"), M, r": splits.train is missing; .*"),
    ("shards-not-a-list", _set("splits", "train", "shards", value={"file": TRAIN0}), M,
     r": splits.train.shards is missing; expected a list of \{file, tokens\}"),
    ("shard-without-tokens", _drop("splits", "train", "shards", "0", "tokens"), M,
     r": splits.train.shards\[0\] must be \{file, tokens\} with a token count >= 0"),
    ("shard-negative-tokens", _set("splits", "train", "shards", "1", "tokens", value=-250), M,
     r": splits.train.shards\[1\] must be .*"),
    ("shard-float-tokens", _set("splits", "train", "shards", "1", "tokens", value=250.0), M,
     r": splits.train.shards\[1\] must be .*"),
    ("shard-path-out", _set("splits", "train", "shards", "0", "file", value="../../etc/passwd"), M,
     r": splits.train.shards\[0\].file '../../etc/passwd'; expected a file name inside the prepared folder"),
    ("shard-path-absolute", _set("splits", "val", "shards", "0", "file", value="/etc/passwd"), M,
     r": splits.val.shards\[0\].file '/etc/passwd'; expected a file name inside the prepared folder"),
    ("shard-no-name", _set("splits", "train", "shards", "0", "file", value=""), M,
     r": splits.train.shards\[0\].file ''; expected a file name .*"),
    ("split-total-disagrees", _set("splits", "train", "tokens", value=999), M,
     r": splits.train.tokens is 999, but its shards hold 400"),
    ("train-empty", _set("splits", "train", value={"tokens": 0, "shards": []}), M, r": splits.train holds no tokens"),
    ("shard-missing", lambda f: (f / TRAIN1).unlink(), TRAIN1,
     rf": shard 1 of the train split is missing \(listed in .*{M}\)"),
    ("val-shard-missing", lambda f: (f / VAL0).unlink(), VAL0, r": shard 0 of the val split is missing .*"),
    ("shard-a-folder", _replace_with_dir(TRAIN0), TRAIN0, r": shard 0 of the train split is not a file .*"),
    ("shard-a-dangling-link", lambda f: ((f / TRAIN1).unlink(), (f / TRAIN1).symlink_to(f / "gone"))[0], TRAIN1,
     r": shard 1 of the train split is not a file .*"),
    ("shard-truncated-a-byte", _resize(TRAIN1, lambda n: n - 1), TRAIN1,
     r": truncated: 499 bytes, but the manifest lists 250 uint16 ids \(500 bytes\); prepare the corpus again"),
    ("shard-truncated-to-nothing", _resize(TRAIN0, lambda n: 0), TRAIN0,
     r": truncated: 0 bytes, but the manifest lists 150 uint16 ids \(300 bytes\); .*"),
    ("shard-longer", _resize(VAL0, lambda n: n + 2), VAL0,
     r": longer than the manifest says: 122 bytes, but the manifest lists 60 uint16 ids \(120 bytes\); .*"),
    ("uint32-said-of-uint16-shards", _set("dtype", value="uint32"), TRAIN0,
     r": longer than the manifest says|: truncated: 300 bytes, but the manifest lists 150 uint32 ids \(600 bytes\).*"),
    ("id-beyond-vocab-in-train", _ids_at(TRAIN1, 17, 60), TRAIN1,
     r": holds token id 60, but the manifest's vocab_size 50 allows ids 0..49; the shard is not the tokenizer's "
     r"output: prepare the corpus again"),
    ("id-beyond-vocab-in-val", _ids_at(VAL0, 59, 65535), VAL0, r": holds token id 65535, but the manifest's .*"),
    ("train-shorter-than-a-window", _set("splits", "train", value={"tokens": 10, "shards": [
        {"file": "short.bin", "tokens": 10}]}), "",
     r": train split: 10 tokens, fewer than one window of data.seq_len \+ 1 = 17"),
]


@pytest.mark.parametrize(("case", "spoil", "named", "pattern"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_prepared_folder_is_one_line_naming_the_file(
    tmp_path: Path, case: str, spoil: Callable[[Path], None], named: str, pattern: str
) -> None:
    folder = _folder(tmp_path)
    if case == "train-shorter-than-a-window":
        np.arange(10, dtype=np.uint16).tofile(folder / "short.bin")
    spoil(folder)
    with pytest.raises(DataError) as err:
        _build(folder)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message, message
    where = str(folder / named) if named else str(folder)
    assert re.fullmatch(re.escape(where) + f"(?:{pattern})", message), message


CONFIG_CASES = [
    ("vocab-disagrees", {"vocab_size": 64},
     rf"config error: data.vocab_size = 64: disagrees with .*{M} \(vocab_size 50, its tokenizer's\); leave it unset "
     r"\(model.vocab_size pads the model's table\)"),
    ("val-path-given", {"val_path": "/somewhere/val.bin"},
     rf"config error: data.val_path = .*: .* is a prepared folder: its val split is in .*{M}"),
]


@pytest.mark.parametrize(("case", "fields", "pattern"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_config_value_against_the_manifest_is_one_line(tmp_path: Path, case: str, fields: dict,
                                                         pattern: str) -> None:
    with pytest.raises(ConfigError) as err:
        _build(_folder(tmp_path), **fields)
    assert "\n" not in str(err.value) and re.fullmatch(pattern, str(err.value)), str(err.value)


def test_shards_from_another_tokenizer_are_refused_naming_both_hashes(tmp_path: Path) -> None:
    """data.tokenizer names a real tokenizer whose hash is not the one the manifest says made the shards."""
    from gputrain.text.tokenizer import train_bpe

    other = train_bpe(["the shards were made by another tokenizer"] * 4, vocab_size=300)
    given = other.save(tmp_path / "mine")
    config = load_config({"data.name": "tokens", "data.path": str(_folder(tmp_path)), "data.seq_len": 16,
                          "data.tokenizer": str(given)}).data
    with pytest.raises(DataError, match=re.escape(f"shards from another tokenizer: made by {TOKENIZER_HASH}, but "
                                                  f"data.tokenizer ({given}) is {other.hash}")):
        build_data(config, seed=0)


def test_a_folder_whose_tokenizer_is_not_its_shards_is_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """OUT/tokenizer replaced after `prepare` (part T's loader gives its hash): the ids would be decoded by
    another vocabulary, so the folder is refused naming the tokenizer folder and both hashes."""
    other = "sha256:" + "ef" * 32
    monkeypatch.setattr(prepared_module, "read_tokenizer", lambda path: type("T", (), {"hash": other})())
    folder = _folder(tmp_path)
    (folder / "tokenizer").mkdir()
    with pytest.raises(DataError) as err:
        _build(folder)
    assert str(err.value) == (
        f"{folder / 'tokenizer'}: tokenizer {other}, but {folder / M} says the shards were made by {TOKENIZER_HASH}: "
        "the folder's tokenizer is not its shards'; prepare the corpus again")


def test_a_shard_cut_under_a_running_job_fails_naming_the_sample_and_the_shard(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    train = _build(folder).train
    os.truncate(folder / TRAIN1, 100)  # after the checks: the job is already running
    guarded = GuardedDataset(train)
    last = len(train) - 1
    item = guarded_collate(guarded.__getitems__([0, last]))
    with pytest.raises(BadSample) as err:
        unwrap(item, "fail", "train")
    assert str(err.value) == (f"train split: sample {last}: ValueError: {folder / TRAIN1}: holds 50 tokens, fewer "
                              f"than the {(last * 16 + 17) - 150} read (was it truncated?); set data.on_error=skip "
                              "to skip unreadable samples")


def test_cli_a_truncated_shard_is_exit_2_one_line_nothing_written(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _resize(TRAIN1, lambda n: n - 7)(folder)
    result = run_cli("train", "--run-dir", str(tmp_path / "run"), "model.name=gpt", "data.name=tokens",
                     f"data.path={folder}", "data.seq_len=16", cwd=tmp_path, timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{folder / TRAIN1}: truncated: 493 bytes" in lines[0], lines[0]
    run = tmp_path / "run"
    assert not run.exists() or not any(run.iterdir()), "nothing may be written before the input is checked"
    assert json.loads((folder / M).read_text())["version"] == 1  # the folder is left as it was
