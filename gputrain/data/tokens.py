"""Pre-tokenised data: a prepared folder (`gputrain prepare`'s shards and manifest), or a flat binary
of uint16 token ids (the nanoGPT `train.bin`/`val.bin` format).

Each split is one stream (data/token_stream.py): a prepared folder's, the concatenation of its shards;
a `.bin`, a stream of one shard. The files are memory-mapped, never read whole. Sample i is the window
of `seq_len + 1` tokens starting at token i·seq_len of the stream (x = its first seq_len, y = shifted
by one; it may span two shards): fixed per index, so the trainer's seeded batch order alone decides
what a step sees, each rank reads only its own windows, and a resumed run is exact on any world
size. A micro-batch is gathered in one pass (`TokenWindows.__getitems__`, which the loader calls).
Validation comes from the prepared folder's val split, or `data.val_path` (or `val.bin` beside
`train.bin`), else from a contiguous `data.val_fraction` (and `test_fraction`) at the end of train.

Checked before training, each file naming itself. A prepared folder: its manifest and shards
(data/prepared.py), `data.vocab_size` equal to the manifest's where given, every shard's ids below
the manifest's vocabulary (scanned in chunks, once per process). A `.bin`: an even byte count, at
least one window, ids below `data.vocab_size` (every file is scanned once for its largest id: an id
beyond the model's embedding table would fail at the first step that drew it), and not 32- or 64-bit
ids written by mistake (every second 16-bit value zero). A window is checked again as it is read, so
a file changed under a running job fails naming the sample (data/guard.py) rather than inside the model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from gputrain.config.paths import not_a_token_file
from gputrain.config.schema import DataConfig
from gputrain.data.prepared import (
    MANIFEST,
    Prepared,
    check_tokenizer,
    folder_tokenizer,
    is_prepared,
    read_prepared,
    read_tokenizer,
)
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.text import contiguous_split
from gputrain.data.token_stream import TokenStream
from gputrain.errors import ConfigError, DataError

_SCAN_CHUNK = 1 << 26  # tokens per chunk when looking for the largest id
_WIDTH_SAMPLE = 1 << 20  # tokens looked at for the pattern of 32/64-bit ids


class TokenWindows(Dataset):
    """Windows `first + i·step` (i < count) of a token stream, as (x, y) int64 [seq_len] pairs."""

    def __init__(
        self,
        stream: TokenStream,
        seq_len: int,
        first: int,
        count: int,
        step: int = 1,
        vocab_size: int | None = None,
    ) -> None:
        self.stream, self.seq_len, self.first, self.count, self.step = stream, seq_len, first, count, step
        self.vocab_size = vocab_size

    @property
    def path(self) -> Path:
        """The file (a single .bin) or the prepared folder the windows come from."""
        return self.stream.where

    def __len__(self) -> int:
        return self.count

    def _start(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise IndexError(index)
        return (self.first + index * self.step) * self.seq_len

    def _checked(self, windows: np.ndarray, starts: list[int]) -> torch.Tensor:
        if self.vocab_size is not None and windows.size and int(windows.max()) >= self.vocab_size:
            row = int(np.flatnonzero((windows >= self.vocab_size).any(axis=1))[0])
            file, _ = self.stream.locate(starts[row] + int(np.argmax(windows[row] >= self.vocab_size)))
            raise ValueError(f"{file}: token id {int(windows[row].max())} >= data.vocab_size = {self.vocab_size}")
        return torch.from_numpy(windows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self._start(index)
        window = self._checked(self.stream.read(start, self.seq_len + 1)[None], [start])[0]
        return window[:-1], window[1:]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A micro-batch's windows gathered in one pass over the memory maps (the DataLoader calls this
        with the whole batch; data/guard.py reads them one by one again only where it fails)."""
        starts = [self._start(int(i)) for i in indices]
        windows = self._checked(self.stream.gather(starts, self.seq_len + 1), starts)
        return [(w[:-1], w[1:]) for w in windows]

    def capped(self, limit: int | None) -> TokenWindows:
        """At most `limit` windows, evenly spread over this split (fixed, so evaluations compare)."""
        if limit is None or self.count <= limit:
            return self
        step = self.count // limit
        return TokenWindows(self.stream, self.seq_len, self.first, limit, self.step * step, self.vocab_size)


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
        raise ConfigError(
            "data.path", "data.name=tokens needs a uint16 token file, a folder with train.bin, or a prepared folder"
        )
    path = Path(config.path)
    val = Path(config.val_path) if config.val_path is not None else None
    if path.is_dir():
        path, val = path / "train.bin", val or (path / "val.bin" if (path / "val.bin").is_file() else None)
    elif val is None and path.name == "train.bin" and (path.parent / "val.bin").is_file():
        val = path.parent / "val.bin"
    return path, val


_scanned: dict[tuple[str, int, int], int] = {}
"""Largest id per shard file (by path, size and modification time) already scanned in this process:
evaluate, a sweep's trials and a rebuilt bundle do not read a corpus again."""


def largest_in(stream: TokenStream) -> tuple[int, Path]:
    """The largest id of a stream and the shard holding it, scanned shard by shard in chunks (no
    shard is ever loaded whole)."""
    best, where = -1, stream.files[0]
    for file in stream.files:
        stat = file.stat()
        key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in _scanned:
            tokens = np.memmap(file, dtype=stream.dtype, mode="r") if stat.st_size else np.empty(0, stream.dtype)
            chunks = (int(tokens[i : i + _SCAN_CHUNK].max()) for i in range(0, len(tokens), _SCAN_CHUNK))
            _scanned[key] = max(chunks, default=-1)
        if _scanned[key] > best:
            best, where = _scanned[key], file
    return best, where


def _bin_streams(config: DataConfig) -> tuple[TokenStream, TokenStream | None, int]:
    """A nanoGPT train.bin (and val.bin), checked as ever: each a stream of one uint16 shard."""
    if config.vocab_size is not None and config.vocab_size > 65536:
        raise ConfigError("data.vocab_size", "token files hold uint16 ids, so at most 65536", config.vocab_size)
    path, val_path = _token_files(config)
    T = config.seq_len
    count_tokens(path, T)
    if val_path is not None:
        count_tokens(val_path, T)
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
    return TokenStream.single(path), TokenStream.single(val_path) if val_path else None, vocab_size


def _prepared_streams(config: DataConfig, prepared: Prepared) -> tuple[TokenStream, TokenStream | None, int]:
    """A prepared folder's train and val streams, checked against the manifest, the vocabulary and the
    tokenizer the user names."""
    manifest = prepared.folder / MANIFEST
    if config.val_path is not None:
        raise ConfigError(
            "data.val_path", f"{prepared.folder} is a prepared folder: its val split is in {manifest}", config.val_path
        )
    if config.vocab_size is not None and config.vocab_size != prepared.vocab_size:
        raise ConfigError(
            "data.vocab_size",
            f"disagrees with {manifest} (vocab_size {prepared.vocab_size}, its tokenizer's); leave it unset "
            "(model.vocab_size pads the model's table)",
            config.vocab_size,
        )
    T = config.seq_len
    train, val = prepared.splits["train"], prepared.splits.get("val")
    if len(train) < T + 1:
        raise DataError(
            f"{prepared.folder}: train split: {len(train)} tokens, fewer than one window of data.seq_len + 1 = {T + 1}"
        )
    for stream in (train, val):
        if stream is None:
            continue
        largest, file = largest_in(stream)
        if largest >= prepared.vocab_size:
            raise DataError(
                f"{file}: holds token id {largest}, but the manifest's vocab_size {prepared.vocab_size} allows ids "
                f"0..{prepared.vocab_size - 1}; the shard is not the tokenizer's output: prepare the corpus again"
            )
    given = getattr(config, "tokenizer", None)  # data.tokenizer: part T's key
    if given is not None:
        check_tokenizer(prepared, read_tokenizer(Path(given)), str(given))
    if val is not None and len(val) < T + 1:
        val = None  # too short for one window: validation comes from the end of train (data.val_fraction)
    return train, val, prepared.vocab_size


@register_data("tokens")
def build_tokens(config: DataConfig, seed: int) -> DataBundle:
    if config.task not in ("auto", "lm"):
        raise ConfigError("data.task", "token data is for language modelling (lm)", config.task)
    given = Path(config.path) if config.path is not None else None
    if given is not None and given.name == MANIFEST and given.is_file():
        given = given.parent  # the manifest named itself: its folder is meant
    prepared = read_prepared(given) if given is not None and is_prepared(given) else None
    if prepared is not None:
        stream, val_stream, vocab_size = _prepared_streams(config, prepared)
    else:
        stream, val_stream, vocab_size = _bin_streams(config)
    T = config.seq_len
    windows = (len(stream) - 1) // T
    test: TokenWindows | None = None
    if val_stream is not None:
        train = TokenWindows(stream, T, 0, windows, vocab_size=vocab_size)
        val: TokenWindows | None = TokenWindows(val_stream, T, 0, (len(val_stream) - 1) // T, vocab_size=vocab_size)
    else:
        tr, va, te = contiguous_split(windows, config.val_fraction, config.test_fraction)
        if len(tr) == 0:
            raise DataError(f"{stream.where}: {windows} windows of data.seq_len + 1 tokens leave none for training")
        train = TokenWindows(stream, T, tr.start, len(tr), vocab_size=vocab_size)
        val = TokenWindows(stream, T, va.start, len(va), vocab_size=vocab_size) if len(va) else None
        test = TokenWindows(stream, T, te.start, len(te), vocab_size=vocab_size) if len(te) else None
    spec = DataSpec(task="lm", input_shape=(T,), vocab_size=vocab_size)
    cap = config.max_eval_samples
    bundle = DataBundle(
        train=train, val=val.capped(cap) if val else None, test=test.capped(cap) if test else None, spec=spec
    )
    if prepared is not None:
        bundle.tokenizer_hash = prepared.tokenizer_hash
        bundle.tokenizer = folder_tokenizer(prepared)
    return bundle
