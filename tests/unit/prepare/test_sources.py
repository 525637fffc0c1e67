"""Each kind of source into shards whose decoded text is the source's documents, each followed by eos:
text files and folders, JSONL (a named field), Parquet (a named column), a saved `datasets` dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.prepare.corpus import documents, manifest, prepare, split_texts

DOCS = documents(40)


def _all_train(out: Path) -> list[str]:
    assert split_texts(out, "val") == []
    return split_texts(out, "train")


def test_a_folder_of_text_files_is_a_document_a_file_in_sorted_path_order(tmp_path: Path, tokenizer_json: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "b").mkdir(parents=True)
    names = []
    for i, text in enumerate(DOCS[:12]):
        name = f"b/{i:02d}.txt" if i % 3 == 0 else f"a{i:02d}.txt"
        (corpus / name).write_text(text, encoding="utf-8")
        names.append(name)
    (corpus / "notes.md").write_text("not matched by the default --glob *.txt")
    (corpus / "empty.txt").write_text("")  # an empty document: nothing to learn, skipped
    out = tmp_path / "out"
    code, _, err = prepare(corpus, "--out", out, "--tokenizer", tokenizer_json, "--val-fraction", "0")
    assert code == 0, err
    expected = [(corpus / name).read_text(encoding="utf-8") for name in sorted(names)]
    assert _all_train(out) == expected
    assert manifest(out)["splits"]["train"]["documents"] == 12


def test_text_files_keep_the_order_given(tmp_path: Path, tokenizer_json: Path) -> None:
    first, second = tmp_path / "z.txt", tmp_path / "a.txt"
    first.write_text(DOCS[0])
    second.write_text(DOCS[1])
    code, _, err = prepare(
        first, second, "--out", tmp_path / "out", "--tokenizer", tokenizer_json, "--val-fraction", "0"
    )
    assert code == 0, err
    assert _all_train(tmp_path / "out") == [DOCS[0], DOCS[1]]


def test_jsonl_a_line_a_document_from_the_named_field(tmp_path: Path, tokenizer_json: Path) -> None:
    path = tmp_path / "c.jsonl"
    rows = [json.dumps({"id": i, "body": text, "text": "not this"}) for i, text in enumerate(DOCS)]
    path.write_text("\n".join(rows[:20]) + "\n\n" + "\n".join(rows[20:]) + "\n")  # a blank line is skipped
    out = tmp_path / "out"
    code, _, err = prepare(path, "--out", out, "--tokenizer", tokenizer_json, "--field", "body", "--val-fraction", "0")
    assert code == 0, err
    assert _all_train(out) == DOCS


def test_parquet_a_row_a_document_from_the_named_column(tmp_path: Path, tokenizer_json: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"n": list(range(len(DOCS))), "content": DOCS}), path, row_group_size=7)
    out = tmp_path / "out"
    code, _, err = prepare(
        path, "--out", out, "--tokenizer", tokenizer_json, "--column", "content", "--val-fraction", "0"
    )
    assert code == 0, err
    assert _all_train(out) == DOCS


def test_a_dataset_saved_with_save_to_disk(tmp_path: Path, tokenizer_json: Path) -> None:
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": DOCS, "label": [i % 2 for i in range(len(DOCS))]}).save_to_disk(
        str(saved),
        max_shard_size="2KB",  # several .arrow files: their order is state.json's
    )
    assert len(list(saved.glob("*.arrow"))) > 1
    out = tmp_path / "out"
    code, _, err = prepare(saved, "--out", out, "--tokenizer", tokenizer_json, "--val-fraction", "0")
    assert code == 0, err
    assert _all_train(out) == DOCS
    assert [Path(s["path"]).suffix for s in manifest(out)["sources"]] == [".arrow"] * len(list(saved.glob("*.arrow")))


def test_kinds_mixed_in_one_folder_by_glob(tmp_path: Path, tokenizer_json: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS[:3]))
    (corpus / "b.txt").write_text(DOCS[3])
    out = tmp_path / "out"
    code, _, err = prepare(corpus, "--out", out, "--tokenizer", tokenizer_json, "--glob", "*", "--val-fraction", "0")
    assert code == 0, err
    assert _all_train(out) == DOCS[:4]
