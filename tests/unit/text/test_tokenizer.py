"""The three kinds of tokenizer behind one class: a tokenizer.json (tokenizers), a .tiktoken file
(checked against tiktoken's own Encoding built from the same ranks) and a trained byte-level BPE;
their hashes, saving and loading back, and the BPE's determinism."""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
import sys
from pathlib import Path

import pytest

from gputrain.errors import DataError, UsageError
from gputrain.text import Tokenizer, load_tokenizer, train_bpe
from gputrain.text.tokenizer import KNOWN_TIKTOKEN, META
from tests.unit.text.corpus import bpe, corpus

SAMPLES = ["def f(x):\n    return x + 1\n", "naïve café — 東京 🙂", "  spaces\tand\ttabs  ", "a" * 50]


def _hf_json(path: Path, vocab_size: int = 280) -> Path:
    """A real tokenizer.json, made with the tokenizers library (a WordPiece-free BPE on the corpus)."""
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]", "</s>"])
    tok.train_from_iterator(corpus(), trainer)
    tok.save(str(path))
    return path


def test_a_tokenizer_json_encodes_as_the_library_does(tmp_path: Path) -> None:
    import tokenizers

    path = _hf_json(tmp_path / "tokenizer.json")
    ours, theirs = load_tokenizer(path), tokenizers.Tokenizer.from_file(str(path))
    assert ours.kind == "hf" and ours.source == str(path)
    assert ours.vocab_size == theirs.get_vocab_size(with_added_tokens=True)
    assert ours.eos_id == theirs.token_to_id("</s>")  # a known end-of-document name
    for text in SAMPLES[:1]:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False).ids
    assert ours.encode_batch(SAMPLES[:1] * 2) == [ours.encode(SAMPLES[0])] * 2
    assert ours.hash == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_model_directory_gives_its_tokenizer_its_eos_and_chat_template(tmp_path: Path) -> None:
    _hf_json(tmp_path / "tokenizer.json")
    config = {"eos_token": {"content": "[UNK]"}, "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(tmp_path)
    assert tok.eos_id == 0  # the config's eos wins over the known names
    assert tok.chat_template == config["chat_template"]
    again = load_tokenizer(tok.save(tmp_path / "saved"))
    assert again.chat_template == config["chat_template"] and again.hash == tok.hash and again.eos_id == 0


def _ranks() -> dict[bytes, int]:
    """Byte-level ranks: the 256 bytes, then a few merges, as a real .tiktoken file has them."""
    ranks = {bytes([b]): b for b in range(256)}
    for merge in (b"th", b"he", b"the", b" t", b" the", b"in", b"re", b"er", b"  ", b"    ", b"de", b"def"):
        ranks[merge] = len(ranks)
    return ranks


def _write_tiktoken(path: Path, ranks: dict[bytes, int]) -> Path:
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks.items()))
    return path


@pytest.mark.parametrize("named", [True, False])
def test_a_tiktoken_file_encodes_as_tiktoken_does(tmp_path: Path, named: bool) -> None:
    """By a standard name (its pattern known), or with a sibling JSON giving pattern and specials."""
    import tiktoken

    ranks = _ranks()
    pattern, _ = KNOWN_TIKTOKEN["r50k_base"]
    specials = {"<|endoftext|>": len(ranks)}
    if named:
        path = _write_tiktoken(tmp_path / "mine.tiktoken", ranks)
        (tmp_path / "mine.json").write_text(json.dumps({"pattern": pattern, "special_tokens": specials}))
    else:
        path = _write_tiktoken(tmp_path / "r50k_base.tiktoken", ranks)
        specials = {"<|endoftext|>": 50256}
    ours = load_tokenizer(path)
    theirs = tiktoken.Encoding("x", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    assert ours.kind == "tiktoken" and ours.eos_id == specials["<|endoftext|>"]
    assert ours.vocab_size == theirs.n_vocab
    for text in [*SAMPLES, "the theme <|endoftext|> there"]:
        assert ours.encode(text) == theirs.encode_ordinary(text)
        assert ours.decode(ours.encode(text)) == text
    assert ours.encode_batch(SAMPLES) == theirs.encode_ordinary_batch(SAMPLES)
    given = {"pattern": pattern, "special_tokens": specials}
    settings = json.dumps(given, sort_keys=True, indent=1, ensure_ascii=False)
    assert ours.hash == "sha256:" + hashlib.sha256(path.read_bytes() + (settings + "\n").encode()).hexdigest()
    copied = pickle.loads(pickle.dumps(ours))  # to a worker process of gputrain prepare
    assert copied.encode(SAMPLES[0]) == ours.encode(SAMPLES[0]) and copied.hash == ours.hash
    saved = load_tokenizer(ours.save(tmp_path / "out"))
    assert saved.hash == ours.hash and saved.encode(SAMPLES[0]) == ours.encode(SAMPLES[0])


def test_the_special_tokens_are_part_of_a_tiktoken_hash(tmp_path: Path) -> None:
    ranks = _ranks()
    pattern, _ = KNOWN_TIKTOKEN["r50k_base"]
    hashes = set()
    for eos in (len(ranks), len(ranks) + 1):
        folder = tmp_path / str(eos)
        folder.mkdir()
        path = _write_tiktoken(folder / "t.tiktoken", ranks)
        (folder / "t.json").write_text(json.dumps({"pattern": pattern, "special_tokens": {"<|endoftext|>": eos}}))
        hashes.add(load_tokenizer(path).hash)
    assert len(hashes) == 2


def test_train_bpe_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    one, two = bpe(320), bpe(320)
    assert one.kind == "bpe" and one.eos_id == 0 and one.vocab_size == 320
    a, b = one.save(tmp_path / "a"), two.save(tmp_path / "b")
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert one.hash == two.hash == load_tokenizer(a).hash
    assert load_tokenizer(a).kind == "bpe"  # the saved record keeps the kind
    assert load_tokenizer(tmp_path / "a").hash == one.hash  # the folder Tokenizer.save was given (a prepared one)
    for text in SAMPLES:
        assert one.decode(one.encode(text)) == text  # byte-level: every text, no unknown token
    assert pickle.loads(pickle.dumps(one)).encode(SAMPLES[1]) == one.encode(SAMPLES[1])
    other = train_bpe(corpus()[:2], 320)
    assert other.hash != one.hash


def test_a_saved_folder_whose_file_changed_is_refused(tmp_path: Path) -> None:
    folder = bpe().save(tmp_path)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    data["model"]["vocab"]["zzz"] = 999
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match="changed since it was saved"):
        load_tokenizer(folder)
    assert json.loads((folder / META).read_text())["kind"] == "bpe"


def test_train_bpe_refuses_a_vocabulary_below_the_bytes() -> None:
    with pytest.raises(UsageError, match="257"):
        train_bpe(["abc"], 100)


def test_decode_refuses_ids_outside_the_vocabulary() -> None:
    tok: Tokenizer = bpe()
    with pytest.raises(DataError, match="outside the tokenizer's vocabulary"):
        tok.decode([1, tok.vocab_size])


@pytest.mark.parametrize("missing", ["tokenizers", "tiktoken"])
def test_a_missing_library_says_how_to_install_it(tmp_path: Path, monkeypatch, missing: str) -> None:
    path = _write_tiktoken(tmp_path / "gpt2.tiktoken", _ranks()) if missing == "tiktoken" else bpe().save(tmp_path)
    monkeypatch.setitem(sys.modules, missing, None)  # importing it raises ImportError
    with pytest.raises(UsageError, match=rf"needs the {missing} package, not installed: pip install 'gputrain\[lm\]'"):
        load_tokenizer(path)
