"""STAND-IN for `gputrain/text/tokenizer.py` (issue 30 part T; the contract's §1): the lead replaces
this module with T's at merge. The rest of `gputrain.prepare` imports only `Tokenizer`,
`load_tokenizer` and `train_bpe` from here, with the contract's signatures, so the swap is one import.

It covers what `prepare` needs over the `tokenizers` library: a `tokenizer.json` (or a folder holding
one, or a saved `tokenizer` folder), a byte-level BPE trained on the corpus, `encode_batch`,
`vocab_size`, `eos_id`, `hash` and `save`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gputrain.errors import DataError, first_line

TOKENIZER_DIR = "tokenizer"
META = "tokenizer_meta.json"
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>")
"""The end-of-document tokens looked for, in this order, in a tokenizer's vocabulary."""


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise DataError("tokenizers are not installed: pip install 'gputrain[lm]'") from None
    return tokenizers


class Tokenizer:
    """A `tokenizers` tokenizer and what the prepared folder records of it (contract §1)."""

    def __init__(self, inner: Any, *, kind: str, source: str) -> None:
        self._inner = inner
        self.kind = kind
        self.source = source
        self.json = inner.to_str()
        self.hash = "sha256:" + hashlib.sha256(self.json.encode()).hexdigest()
        self.vocab_size = int(inner.get_vocab_size(with_added_tokens=True))
        vocab = inner.get_vocab(with_added_tokens=True)
        self.eos_id: int | None = next((int(vocab[name]) for name in EOS_NAMES if name in vocab), None)
        self.chat_template: str | None = None

    def encode(self, text: str) -> list[int]:
        return list(self._inner.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._inner.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._inner.decode(list(ids), skip_special_tokens=False))

    def save(self, directory: Path) -> Path:
        folder = Path(directory) / TOKENIZER_DIR
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tokenizer.json").write_text(self.json, encoding="utf-8")
        meta = {"kind": self.kind, "hash": self.hash, "vocab_size": self.vocab_size, "eos_id": self.eos_id}
        (folder / META).write_text(json.dumps(meta, sort_keys=True, indent=1) + "\n")
        return folder


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json, a folder holding one, or a saved `tokenizer` folder.

    Raises:
        DataError: one line naming the path where it is none of these.
    """
    given = Path(path)
    file = given / "tokenizer.json" if given.is_dir() else given
    kind = "hf"
    if given.is_dir() and (given / META).is_file():
        try:
            kind = str(json.loads((given / META).read_text())["kind"])
        except (OSError, ValueError, KeyError, TypeError):
            raise DataError(f"{given / META}: not a tokenizer's record (kind, hash, vocab_size)") from None
    if not file.is_file():
        raise DataError(f"tokenizer {given}: no such tokenizer file; give a tokenizer.json or a folder holding one")
    tokenizers = _tokenizers()
    try:
        inner = tokenizers.Tokenizer.from_file(str(file))
    except Exception as err:  # noqa: BLE001 (tokenizers raises a bare Exception for a file it cannot parse)
        raise DataError(f"tokenizer {file}: not a tokenizers tokenizer.json ({first_line(err, 120)})") from None
    return Tokenizer(inner, kind=kind, source=str(given))


def train_bpe(texts: Iterable[str], vocab_size: int, *, eos: str = "<|endoftext|>") -> Tokenizer:
    """A byte-level BPE of `vocab_size` tokens (with `eos`) trained on `texts`: the same for the same texts."""
    tokenizers = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    inner = tokenizers.Tokenizer(models.BPE())
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    inner.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(inner, kind="bpe", source="trained by gputrain prepare")
