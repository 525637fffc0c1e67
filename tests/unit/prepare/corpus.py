"""What the tests of `gputrain prepare` share: a real `tokenizers` byte-level BPE tokenizer.json, small
corpora of each kind, the command run in this process, and a prepared folder read back."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
from pathlib import Path
from typing import Any

import numpy as np

from gputrain.cli import main

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog,", "héllo", "wörld", "🙂", "naïve"]
WORDS += ["café", "alpha", "beta", "gamma\n"]
EOS = "<|endoftext|>"


def documents(count: int, seed: int = 0) -> list[str]:
    """`count` different non-empty texts (non-ASCII too, newlines inside)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(5 + rng.randrange(60))) + f" #{i}" for i in range(count)]


def write_tokenizer(path: Path, texts: list[str], vocab_size: int = 400) -> Path:
    """A byte-level BPE tokenizer.json, trained by `tokenizers` itself (not by gputrain), with EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return path


def prepare(*args: str | Path) -> tuple[int, str, str]:
    """`gputrain prepare ARGS --quiet` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["prepare", *map(str, args), "--quiet"])
        except SystemExit as exit:  # argparse's refusals
            code = int(exit.code or 0)
    return code, out.getvalue(), err.getvalue()


def manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())


def split_ids(out: Path, split: str) -> np.ndarray:
    """A split's whole token stream: its shards, in order, concatenated."""
    record = manifest(out)
    parts = [
        np.fromfile(out / s["file"], dtype=np.dtype(record["dtype"]).newbyteorder("<"))
        for s in record["splits"][split]["shards"]
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=record["dtype"])


def split_texts(out: Path, split: str) -> list[str]:
    """A split's documents decoded: the stream cut after each eos id (which must end it)."""
    from tokenizers import Tokenizer

    record = manifest(out)
    tok = Tokenizer.from_file(str(out / "tokenizer" / "tokenizer.json"))
    ids = split_ids(out, split).tolist()
    assert not ids or ids[-1] == record["eos_id"], "a split's stream ends with eos"
    texts, start = [], 0
    for i, token in enumerate(ids):
        if token == record["eos_id"]:
            texts.append(tok.decode(ids[start:i], skip_special_tokens=False))
            start = i + 1
    return texts


def files_of(folder: Path) -> dict[str, str]:
    """Every file under `folder` and its sha256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
