"""A small corpus on disk (Python's own standard library sources), a BPE trained on it, and a token
file of it, for the tests of tokenizers and of runs that keep one."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gputrain.text import Tokenizer, train_bpe

STDLIB = Path(os.__file__).parent
FILES = ("abc.py", "bisect.py", "colorsys.py", "keyword.py", "this.py", "heapq.py")


def corpus() -> list[str]:
    """A few standard library modules' text (the same files on every machine of one Python)."""
    return [(STDLIB / name).read_text(encoding="utf-8") for name in FILES]


def bpe(vocab_size: int = 300) -> Tokenizer:
    return train_bpe(corpus(), vocab_size)


def write_token_file(tokenizer: Tokenizer, path: Path) -> Path:
    """The corpus through `tokenizer` as nanoGPT's .bin: uint16 ids, each document followed by the eos."""
    assert tokenizer.eos_id is not None
    ids: list[int] = []
    for doc in tokenizer.encode_batch(corpus()):
        ids += [*doc, tokenizer.eos_id]
    np.array(ids, dtype=np.uint16).tofile(path)
    return path
