"""The prepared folder (the contract's §3): the manifest's counts and checksums, shards cut at
--shard-tokens, uint16/uint32 by vocabulary, the same bytes with 1 and 4 workers, a document-level val
split that stays put, a complete folder left as it is, and a trained tokenizer the same every time."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from gputrain.prepare import encode, work
from gputrain.prepare.encode import draws
from gputrain.prepare.shards import dtype_for
from tests.unit.prepare.corpus import documents, files_of, manifest, prepare, split_ids, split_texts

DOCS = documents(120)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS), encoding="utf-8")
    return path


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many batches of a few documents: the pool and the resume state see many steps."""
    monkeypatch.setattr(work, "BATCH_DOCUMENTS", 7)


def test_manifest_counts_and_checksums(corpus: Path, tmp_path: Path, tokenizer_json: Path) -> None:
    out = tmp_path / "out"
    code, stdout, err = prepare(
        corpus, "--out", out, "--tokenizer", tokenizer_json, "--val-fraction", "0.2", "--shard-tokens", "1000"
    )
    assert code == 0, err
    assert "train" in stdout and "val" in stdout
    record = manifest(out)
    assert (record["format"], record["version"], record["dtype"]) == ("gputrain-tokens", 1, "uint16")
    assert record["tokenizer"]["dir"] == "tokenizer"
    meta = json.loads((out / "tokenizer" / "tokenizer_meta.json").read_text())
    assert meta["hash"] == record["tokenizer"]["hash"] and meta["eos_id"] == record["eos_id"]
    texts = {"train": split_texts(out, "train"), "val": split_texts(out, "val")}
    assert sorted(texts["train"] + texts["val"]) == sorted(DOCS)
    for split, entry in record["splits"].items():
        assert entry["documents"] == len(texts[split])
        assert entry["bytes"] == sum(len(t.encode("utf-8")) for t in texts[split])
        assert entry["tokens"] == len(split_ids(out, split)) == sum(s["tokens"] for s in entry["shards"])
        for index, shard in enumerate(entry["shards"]):
            data = (out / shard["file"]).read_bytes()
            assert shard["file"] == f"{split}-{index:05d}.bin"
            assert len(data) == 2 * shard["tokens"]
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
            last = index == len(entry["shards"]) - 1
            assert shard["tokens"] == 1000 or last, "every shard but the last is full"
    assert len(record["splits"]["train"]["shards"]) > 2
    assert record["sources"] == [
        {
            "path": str(corpus.resolve()),
            "bytes": corpus.stat().st_size,
            "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest(),
        }
    ]
    assert record["settings"]["val_fraction"] == 0.2 and record["settings"]["shard_tokens"] == 1000
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["manifest.json", "tokenizer", *(s["file"] for e in record["splits"].values() for s in e["shards"])]
    ), "no state or part file left"


def test_one_and_four_workers_write_the_same_bytes(
    corpus: Path, tmp_path: Path, tokenizer_json: Path, small_batches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    outs = []
    for workers, start in ((1, "in-process"), (4, "fork"), (4, "spawn")):
        if start == "spawn":  # what a process running another thread starts its workers with
            monkeypatch.setattr(encode.threading, "active_count", lambda: 2)
        out = tmp_path / f"out{workers}-{start}"
        args = ("--val-fraction", "0.1", "--shard-tokens", "700", "--workers", str(workers))
        code, _, err = prepare(corpus, "--out", out, "--tokenizer", tokenizer_json, *args)
        assert code == 0, err
        outs.append(files_of(out))
    assert outs[0] == outs[1] == outs[2]
    assert sum(name.startswith("train-") for name in outs[0]) > 3


def test_val_split_is_by_document_and_stable(corpus: Path, tmp_path: Path, tokenizer_json: Path) -> None:
    def split(seed: int, name: str) -> list[str]:
        out = tmp_path / name
        code, _, err = prepare(
            corpus, "--out", out, "--tokenizer", tokenizer_json, "--val-fraction", "0.25", "--seed", str(seed)
        )
        assert code == 0, err
        return split_texts(out, "val")

    val = split(0, "a")
    assert val == split(0, "b"), "the same seed: the same split"
    assert set(val) <= set(DOCS), "val holds whole documents"
    expected = [t for i, t in enumerate(DOCS) if draws(i, t.encode(), 0)[0] < 0.25]
    assert val == expected
    assert 0 < len(val) < len(DOCS)
    assert split(1, "c") != val, "another seed: another split"


def test_a_complete_folder_is_left_as_it_is(corpus: Path, tmp_path: Path, tokenizer_json: Path) -> None:
    out = tmp_path / "out"
    assert prepare(corpus, "--out", out, "--tokenizer", tokenizer_json)[0] == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    code, stdout, err = prepare(corpus, "--out", out, "--tokenizer", tokenizer_json, "--workers", "1")
    assert code == 0 and "left as it is" in err and not stdout
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_a_trained_tokenizer_is_the_same_every_time_and_never_sees_val(corpus: Path, tmp_path: Path) -> None:
    hashes = []
    for name in ("a", "b"):
        out = tmp_path / name
        code, _, err = prepare(corpus, "--out", out, "--train-tokenizer", "300", "--val-fraction", "0.3")
        assert code == 0, err
        record = manifest(out)
        assert record["vocab_size"] == 300 and record["tokenizer"]["kind"] == "bpe"
        hashes.append(record["tokenizer"]["hash"])
        assert sorted(split_texts(out, "train") + split_texts(out, "val")) == sorted(DOCS)
    assert hashes[0] == hashes[1]
    # trained on train only: the val documents do not change it
    from gputrain.text.tokenizer import train_bpe

    assert train_bpe(split_texts(tmp_path / "a", "train"), 300).hash == hashes[0]


def test_ids_are_uint32_beyond_65536_tokens(tmp_path: Path, tokenizer_json: Path) -> None:
    from tokenizers import AddedToken, Tokenizer

    assert (dtype_for(65536), dtype_for(65537)) == ("uint16", "uint32")
    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.add_tokens([AddedToken(f"zz{i}zz", special=False) for i in range(65536)])
    big = tmp_path / "big.json"
    tok.save(str(big))
    text = tmp_path / "a.txt"
    text.write_text("hello zz65535zz world")
    out = tmp_path / "out"
    code, _, err = prepare(text, "--out", out, "--tokenizer", big, "--val-fraction", "0")
    assert code == 0, err
    ids = split_ids(out, "train")
    assert manifest(out)["dtype"] == "uint32" and ids.dtype == np.dtype("<u4")
    assert int(ids.max()) > 65535 and split_texts(out, "train") == ["hello zz65535zz world"]


def test_the_split_draw_depends_on_the_seed_the_index_and_the_text() -> None:
    text = DOCS[0].encode()
    base = draws(0, text, 0)
    assert draws(0, text, 0) == base
    assert draws(1, text, 0) != base and draws(0, text, 1) != base and draws(0, DOCS[1].encode(), 0) != base
    firsts = [draws(i, text, 0)[0] for i in range(2000)]
    assert 0.45 < float(np.mean(np.array(firsts) < 0.5)) < 0.55, "uniform: a fraction draws its share"
