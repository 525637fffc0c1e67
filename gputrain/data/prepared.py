"""A prepared folder (what `gputrain prepare` writes): its manifest, read and checked, and its splits.

    OUT/manifest.json            {"format": "gputrain-tokens", "version": 1, "dtype", "vocab_size",
                                  "eos_id", "tokenizer": {"kind", "hash", "dir"}, "splits": {...}, ...}
    OUT/tokenizer/               the tokenizer the ids mean
    OUT/train-00000.bin, ...     raw little-endian ids; one split = the concatenation of its shards
    OUT/val-00000.bin, ...

Checked before anything is trained or written, each failure one line naming the file: the manifest
is JSON and ours (format, version, dtype, vocabulary, the splits' shard lists and counts); every
shard is a plain file inside the folder, present, and exactly its `tokens` × the dtype's size (a
truncated or overlong shard is named); no id is at or above the vocabulary (data/tokens.py scans);
and the shards were made by the tokenizer the folder holds and by the one the user names
(`data.tokenizer`), where either is given (the manifest's tokenizer hash against theirs). The
shards' sha256 are not recomputed here: a run would read the whole corpus once per start on every
rank for it; the size check catches a cut shard, and the scan ids that do not belong to the
vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gputrain.data.token_stream import TokenStream
from gputrain.errors import DataError, first_line
from gputrain.text.tokenizer import Tokenizer, load_tokenizer

MANIFEST = "manifest.json"
FORMAT, VERSION = "gputrain-tokens", 1
DTYPES = {"uint16": 65536, "uint32": 1 << 32}
"""The id types a prepared folder holds, with the vocabulary each can express."""


def is_prepared(path: Path) -> bool:
    """A folder with a manifest.json: read as a prepared folder (else the nanoGPT layout)."""
    return path.is_dir() and (path / MANIFEST).exists()


@dataclass(frozen=True, slots=True)
class Prepared:
    folder: Path
    dtype: str
    vocab_size: int
    eos_id: int | None
    tokenizer_hash: str | None
    tokenizer_dir: Path | None
    splits: dict[str, TokenStream]
    """Each split with at least one token: "train" always, "val" where the manifest has one."""


def read_prepared(folder: Path) -> Prepared:
    """The prepared folder's manifest, checked against its shards.

    Raises:
        DataError: one line naming the manifest or the shard, and what is wrong.
    """
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DataError(f"{path}: not a readable JSON manifest ({type(err).__name__}: {first_line(err)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise DataError(
            f"{path}: not a gputrain prepared folder's manifest (format {found!r}, expected {FORMAT!r}); "
            "make the folder with `gputrain prepare`"
        )
    if not _count(manifest.get("version")) or manifest["version"] != VERSION:  # (true == 1 in Python)
        raise DataError(
            f"{path}: manifest version {manifest.get('version')!r}; this gputrain reads version {VERSION} "
            "(prepare the corpus again with this version)"
        )
    dtype = manifest.get("dtype")
    if dtype not in DTYPES:
        raise DataError(f"{path}: dtype {dtype!r}; a prepared folder holds uint16 or uint32 ids")
    vocab = manifest.get("vocab_size")
    if not isinstance(vocab, int) or not _count(vocab) or not 1 <= vocab <= DTYPES[dtype]:
        raise DataError(f"{path}: vocab_size {vocab!r}; expected a count from 1 to {DTYPES[dtype]} for {dtype} ids")
    eos = manifest.get("eos_id")
    if eos is not None and (not _count(eos) or eos >= vocab):
        raise DataError(f"{path}: eos_id {eos!r}; expected an id below vocab_size {vocab}")
    tokenizer = manifest.get("tokenizer")
    tokenizer_hash, tokenizer_dir = None, None
    if tokenizer is not None:
        if not isinstance(tokenizer, dict):
            raise DataError(f"{path}: tokenizer must be an object with kind, hash and dir")
        tokenizer_hash = tokenizer.get("hash")
        if tokenizer_hash is not None and not isinstance(tokenizer_hash, str):
            raise DataError(f"{path}: tokenizer.hash {tokenizer_hash!r}; expected 'sha256:<hex>'")
        if tokenizer.get("dir") is not None:
            tokenizer_dir = folder / _inside(path, "tokenizer.dir", tokenizer["dir"])
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or not isinstance(splits.get("train"), dict):
        raise DataError(f"{path}: splits.train is missing; the manifest lists each split's shards")
    streams: dict[str, TokenStream] = {}
    for name in ("train", "val"):
        if splits.get(name) is not None:
            stream = _split(folder, path, name, splits[name], dtype)
            if stream is not None:
                streams[name] = stream
    if "train" not in streams:
        raise DataError(f"{path}: splits.train holds no tokens")
    return Prepared(folder, dtype, vocab, eos, tokenizer_hash, tokenizer_dir, streams)


def _split(folder: Path, path: Path, name: str, split: Any, dtype: str) -> TokenStream | None:
    where = f"splits.{name}"
    shards = split.get("shards") if isinstance(split, dict) else None
    if not isinstance(shards, list):
        raise DataError(f"{path}: {where}.shards is missing; expected a list of {{file, tokens}}")
    itemsize = np.dtype(dtype).itemsize
    files, counts = [], []
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict) or not _count(shard.get("tokens")):
            raise DataError(f"{path}: {where}.shards[{i}] must be {{file, tokens}} with a token count >= 0")
        file = folder / _inside(path, f"{where}.shards[{i}].file", shard.get("file"))
        tokens = shard["tokens"]
        if not file.is_file():
            problem = "is not a file" if file.exists() or file.is_symlink() else "is missing"
            raise DataError(f"{file}: shard {i} of the {name} split {problem} (listed in {path})")
        size = file.stat().st_size
        if size != tokens * itemsize:
            cut = "truncated" if size < tokens * itemsize else "longer than the manifest says"
            raise DataError(
                f"{file}: {cut}: {size} bytes, but the manifest lists {tokens} {dtype} ids ({tokens * itemsize} "
                "bytes); prepare the corpus again"
            )
        files.append(file)
        counts.append(tokens)
    total = split.get("tokens")
    if total is not None and total != sum(counts):
        raise DataError(f"{path}: {where}.tokens is {total!r}, but its shards hold {sum(counts)}")
    if not files or sum(counts) == 0:
        return None
    return TokenStream(files, dtype, counts, where=folder)


def _inside(path: Path, field: str, name: Any) -> str:
    """A file name of the manifest: a plain name in the folder (no path out of it)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise DataError(f"{path}: {field} {name!r}; expected a file name inside the prepared folder")
    return name


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_tokenizer(prepared: Prepared, given: Any, source: str) -> None:
    """The shards were made by the tokenizer the user names (`data.tokenizer`): their hashes agree.

    Raises:
        DataError: naming the manifest, both hashes and the tokenizer's path.
    """
    theirs = getattr(given, "hash", None)
    if theirs is None or prepared.tokenizer_hash is None or theirs == prepared.tokenizer_hash:
        return
    raise DataError(
        f"{prepared.folder / MANIFEST}: shards from another tokenizer: made by {prepared.tokenizer_hash}, but "
        f"data.tokenizer ({source}) is {theirs}; prepare the corpus again with it, or leave data.tokenizer unset"
    )


def folder_tokenizer(prepared: Prepared) -> Tokenizer | None:
    """The tokenizer the folder holds (None where it holds none), checked to be the one the manifest
    says made the shards.

    Raises:
        DataError: naming the tokenizer folder and both hashes.
    """
    if prepared.tokenizer_dir is None or not prepared.tokenizer_dir.exists():
        return None
    tokenizer = read_tokenizer(prepared.tokenizer_dir)
    theirs = getattr(tokenizer, "hash", None)
    if theirs is not None and prepared.tokenizer_hash is not None and theirs != prepared.tokenizer_hash:
        raise DataError(
            f"{prepared.tokenizer_dir}: tokenizer {theirs}, but {prepared.folder / MANIFEST} says the shards were made "
            f"by {prepared.tokenizer_hash}: the folder's tokenizer is not its shards'; prepare the corpus again"
        )
    return tokenizer


def read_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer at `path` (gputrain/text/tokenizer.py's `load_tokenizer`: a folder, a file)."""
    return load_tokenizer(path)
