"""Prepared folders written directly, as issue 30's contract §3 lays them out (what `gputrain prepare`
writes): token shards and a manifest.json, so the reader is tested without the writer."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

TOKENIZER_HASH = "sha256:" + "ab" * 32


def token_ids(n: int, vocab: int = 50, seed: int = 0) -> np.ndarray:
    """`n` ids of a learnable stream: next = (3·prev + 1) mod vocab, with rare random restarts."""
    rng = np.random.default_rng(seed)
    ids = np.empty(n, dtype=np.int64)
    ids[0] = 0
    restarts = rng.random(n) < 0.02
    draws = rng.integers(vocab, size=n)
    for i in range(1, n):
        ids[i] = draws[i] if restarts[i] else (3 * ids[i - 1] + 1) % vocab
    return ids


def write_prepared(
    folder: Path,
    train: Sequence[np.ndarray],
    val: Sequence[np.ndarray] = (),
    vocab_size: int = 50,
    dtype: str = "uint16",
    **manifest: Any,
) -> Path:
    """A prepared folder holding `train` (and `val`) as their shards, in order; `manifest` overrides
    the manifest's top-level fields."""
    folder.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name, shards in (("train", train), ("val", val)):
        listed = []
        for k, ids in enumerate(shards):
            data = np.asarray(ids).astype(dtype)
            file = f"{name}-{k:05d}.bin"
            data.astype(np.dtype(dtype).newbyteorder("<")).tofile(folder / file)
            listed.append({"file": file, "tokens": len(data), "sha256": hashlib.sha256(data.tobytes()).hexdigest()})
        splits[name] = {"tokens": sum(s["tokens"] for s in listed), "documents": len(listed), "bytes": 0,
                        "shards": listed}
    # (no tokenizer/ folder: the manifest names one, but these tests stand in for part T's loader where
    # they need it; an empty folder would be a broken tokenizer to the real one)
    content = {
        "format": "gputrain-tokens", "version": 1, "dtype": dtype, "vocab_size": vocab_size, "eos_id": vocab_size - 1,
        "tokenizer": {"kind": "bpe", "hash": TOKENIZER_HASH, "dir": "tokenizer"},
        "splits": splits, "sources": [], "settings": {"shard_tokens": max((len(s) for s in train), default=0)},
        **manifest,
    }
    (folder / "manifest.json").write_text(json.dumps(content, sort_keys=True, indent=1))
    return folder


def edit_manifest(folder: Path, edit: Any) -> None:
    """Rewrite the folder's manifest through `edit(manifest)` (in place)."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest, sort_keys=True, indent=1))
