"""Pre-tokenised data: a flat binary of uint16 token ids (the nanoGPT `train.bin`/`val.bin` format).

The file is memory-mapped, never read whole. Sample i is the window of `seq_len + 1` tokens
starting at token i·seq_len (x = its first seq_len, y = shifted by one): fixed per index, so the
trainer's seeded batch order alone decides what a step sees and a resumed run is exact.
Validation comes from `data.val_path` (or `val.bin` beside `train.bin`), else from a contiguous
`data.val_fraction` (and `test_fraction`) at the end of the file.

Checked before training, each file naming itself: an even byte count, at least one window, ids
below `data.vocab_size` (every file is scanned once for its largest id: an id beyond the model's
embedding table would fail at the first step that drew it), and not 32- or 64-bit ids written by
mistake (every second 16-bit value zero). A window is checked again as it is read, so a file
changed under a running job fails naming the sample (data/guard.py) rather than inside the model.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from gputrain.config.paths import not_a_token_file
from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.text import contiguous_split
from gputrain.errors import ConfigError, DataError

_SCAN_CHUNK = 1 << 26  # tokens per chunk when looking for the largest id
_WIDTH_SAMPLE = 1 << 20  # tokens looked at for the pattern of 32/64-bit ids


class TokenWindows(Dataset):
    """Windows `first + i·step` (i < count) of a token file, as (x, y) int64 [seq_len] pairs."""

    def __init__(
        self, path: Path, seq_len: int, first: int, count: int, step: int = 1, vocab_size: int | None = None
    ) -> None:
        self.path, self.seq_len, self.first, self.count, self.step = path, seq_len, first, count, step
        self.vocab_size = vocab_size
        self._tokens: np.memmap | None = None
        self._pid = -1

    def __len__(self) -> int:
        return self.count

    def _map(self) -> np.memmap:
        # one map per process: opened lazily so DataLoader workers never pickle the mapping itself
        if self._tokens is None or self._pid != os.getpid():
            self._tokens, self._pid = np.memmap(self.path, dtype=np.uint16, mode="r"), os.getpid()
        return self._tokens

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.count:
            raise IndexError(index)
        start = (self.first + index * self.step) * self.seq_len
        tokens = self._map()[start : start + self.seq_len + 1]
        if len(tokens) != self.seq_len + 1:
            raise ValueError(f"{self.path}: window {index} runs past the end of the file (was it truncated?)")
        if self.vocab_size is not None and int(tokens.max()) >= self.vocab_size:
            raise ValueError(f"{self.path}: token id {int(tokens.max())} >= data.vocab_size = {self.vocab_size}")
        window = torch.from_numpy(tokens.astype(np.int64))
        return window[:-1], window[1:]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}

    def capped(self, limit: int | None) -> TokenWindows:
        """At most `limit` windows, evenly spread over this split (fixed, so evaluations compare)."""
        if limit is None or self.count <= limit:
            return self
        step = self.count // limit
        return TokenWindows(self.path, self.seq_len, self.first, limit, self.step * step, self.vocab_size)


def count_tokens(path: Path, seq_len: int) -> int:
    """Tokens in a uint16 file, after checking it exists, has an even size and holds one window.

    Raises:
        DataError: naming the file.
    """
    if not path.is_file():
        raise DataError(not_a_token_file(path))
    size = path.stat().st_size
    if size % 2:
        raise DataError(f"{path}: odd byte count ({size}): not a flat array of uint16 token ids")
    if size // 2 < seq_len + 1:
        raise DataError(f"{path}: {size // 2} tokens, fewer than one window of data.seq_len + 1 = {seq_len + 1}")
    return size // 2


def largest_token(path: Path) -> int:
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    return max(int(tokens[i : i + _SCAN_CHUNK].max()) for i in range(0, len(tokens), _SCAN_CHUNK))


def first_at_least(path: Path, limit: int) -> int:
    """Position of the first token id >= limit in the file (one is known to be there)."""
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    for i in range(0, len(tokens), _SCAN_CHUNK):
        hits = np.flatnonzero(tokens[i : i + _SCAN_CHUNK] >= limit)
        if len(hits):
            return i + int(hits[0])
    return -1


def check_width(path: Path) -> None:
    """Refuse a file of 32- or 64-bit integers (`np.array(ids).tofile()` writes int64): read as
    uint16, every second value of its first million is then 0, which real token streams never are.

    Raises:
        DataError: naming the file.
    """
    head = np.asarray(np.memmap(path, dtype=np.uint16, mode="r")[:_WIDTH_SAMPLE])
    if len(head) >= 64 and not head[1::2].any() and head[0::2].any():
        wide = 64 if not head[1::4].any() and not head[2::4].any() and not head[3::4].any() else 32
        raise DataError(
            f"{path}: every second 16-bit value is 0: these look like {wide}-bit token ids, but token files hold "
            f"uint16 ids (write them with np.array(ids, dtype=np.uint16).tofile(...))"
        )


_TEXT_SAMPLE = 1 << 16  # bytes looked at for text written where token ids belong


def check_not_text(path: Path) -> None:
    """Refuse a text file given as token ids: read as uint16, pairs of its bytes would become ids of
    a vocabulary the model never had. Its first 64 KiB are text when no byte is a control character
    other than white space (text in UTF-8, Latin-1 or cp1252 alike). A token stream always has such
    bytes: every id below 8192 (a tokenizer's commonest tokens; all of a character-level or
    byte-level file's) has a high byte below 0x20.

    Raises:
        DataError: naming the file and what it looks like.
    """
    with path.open("rb") as file:
        head = file.read(_TEXT_SAMPLE)
    # (UTF-16 text has zero bytes and is left alone: read as uint16 ids it gives the characters' code
    # points, which is what a file of `ord(c)` ids holds, the same meaning)
    if len(head) >= 16 and not head.translate(None, _TEXT_BYTES):
        snippet = head[:60].decode("utf-8", errors="replace")
        raise DataError(
            f"{path}: looks like text ({snippet!r}...), not uint16 token ids; train on a .txt file with "
            "data.name=text, or tokenise it into a .bin of uint16 ids (np.array(ids, dtype=np.uint16).tofile(...))"
        )


_TEXT_BYTES = bytes([*range(0x20, 0x7F), *range(0x80, 0x100), *b"\t\n\r\x0b\x0c"])
"""The bytes text is made of: all but the control characters (other than white space) and DEL."""


def check_vocab(path: Path, vocab_size: int) -> None:
    """Every id in the file is below `vocab_size`.

    Raises:
        DataError: naming the file, its largest id (and where the first too large one is) and the size.
    """
    largest = largest_token(path)
    if largest >= vocab_size:
        where = first_at_least(path, vocab_size)
        raise DataError(
            f"{path}: holds token id {largest} (largest; the first id >= {vocab_size} is at token {where}), but "
            f"data.vocab_size = {vocab_size} allows ids 0..{vocab_size - 1}; set data.vocab_size to at least "
            f"{largest + 1}, or leave it unset to size it from the files"
        )


def _token_files(config: DataConfig) -> tuple[Path, Path | None]:
    if config.path is None:
        raise ConfigError("data.path", "data.name=tokens needs a uint16 token file (or a folder with train.bin)")
    path = Path(config.path)
    val = Path(config.val_path) if config.val_path is not None else None
    if path.is_dir():
        path, val = path / "train.bin", val or (path / "val.bin" if (path / "val.bin").is_file() else None)
    elif val is None and path.name == "train.bin" and (path.parent / "val.bin").is_file():
        val = path.parent / "val.bin"
    return path, val


@register_data("tokens")
def build_tokens(config: DataConfig, seed: int) -> DataBundle:
    if config.task not in ("auto", "lm"):
        raise ConfigError("data.task", "token data is for language modelling (lm)", config.task)
    path, val_path = _token_files(config)
    T = config.seq_len
    windows = (count_tokens(path, T) - 1) // T
    val_windows = (count_tokens(val_path, T) - 1) // T if val_path is not None else 0
    files = [path] if val_path is None else [path, val_path]
    for file in files:
        check_not_text(file)
        check_width(file)
    vocab_size = config.vocab_size
    if vocab_size is None:
        vocab_size = 1 + max(largest_token(p) for p in files)
    else:
        for file in files:
            check_vocab(file, vocab_size)
    test: TokenWindows | None = None
    if val_path is not None:
        train = TokenWindows(path, T, 0, windows, vocab_size=vocab_size)
        val: TokenWindows | None = TokenWindows(val_path, T, 0, val_windows, vocab_size=vocab_size)
    else:
        tr, va, te = contiguous_split(windows, config.val_fraction, config.test_fraction)
        if len(tr) == 0:
            raise DataError(f"{path}: {windows} windows of data.seq_len + 1 tokens leave none for training")
        train = TokenWindows(path, T, tr.start, len(tr), vocab_size=vocab_size)
        val = TokenWindows(path, T, va.start, len(va), vocab_size=vocab_size) if len(va) else None
        test = TokenWindows(path, T, te.start, len(te), vocab_size=vocab_size) if len(te) else None
    spec = DataSpec(task="lm", input_shape=(T,), vocab_size=vocab_size)
    cap = config.max_eval_samples
    return DataBundle(
        train=train, val=val.capped(cap) if val else None, test=test.capped(cap) if test else None, spec=spec
    )
