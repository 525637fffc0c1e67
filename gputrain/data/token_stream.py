"""One split's token ids as one stream: the concatenation of its shard files, memory-mapped.

A nanoGPT `.bin` is a stream of one shard; a prepared folder's split (data/prepared.py) is the
concatenation of its `train-00000.bin, train-00001.bin, ...` in order. A read of `n` tokens at
position `p` may span a shard boundary: it is the same `n` tokens the concatenation would give, so
the windows of a corpus do not depend on where `prepare` cut it.

Nothing is read up front: each shard is mapped, read-only, the first time a process reads from it
(opened lazily per process, so a DataLoader worker maps its own and no mapping is ever pickled), and
a read copies only the tokens asked for. A corpus far larger than the process's memory streams.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class TokenStream:
    """The token ids of `files` (raw little-endian `dtype`), concatenated, of `tokens[i]` ids each."""

    def __init__(self, files: Sequence[Path], dtype: str, tokens: Sequence[int], where: Path | None = None) -> None:
        if len(files) != len(tokens) or not files:
            raise ValueError("a token stream needs one token count per file, and at least one file")
        self.files = tuple(Path(f) for f in files)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.ends = np.cumsum(np.asarray(tokens, dtype=np.int64))
        self.where = where if where is not None else self.files[0]
        """What messages name for the stream as a whole: the file, or the prepared folder."""
        self._maps: list[np.memmap | None] = [None] * len(self.files)
        self._pid = -1

    @classmethod
    def single(cls, path: Path, dtype: str = "uint16") -> TokenStream:
        """A flat file of ids as a stream of one shard (its size a whole number of ids)."""
        return cls([path], dtype, [path.stat().st_size // np.dtype(dtype).itemsize])

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_maps": [None] * len(self.files), "_pid": -1}

    def _shard(self, k: int) -> np.memmap | np.ndarray:
        if self._pid != os.getpid():  # a forked worker maps the files again, its own
            self._maps, self._pid = [None] * len(self.files), os.getpid()
        mapped = self._maps[k]
        if mapped is None:
            # the whole file as it is now (a shorter one is then named by the read); an empty file
            # cannot be mapped (mmap refuses length 0) and holds nothing to read
            empty = os.path.getsize(self.files[k]) < self.dtype.itemsize
            mapped = None if empty else np.memmap(self.files[k], dtype=self.dtype, mode="r")
            self._maps[k] = mapped
        return mapped if mapped is not None else np.empty(0, dtype=self.dtype)

    def locate(self, position: int) -> tuple[Path, int]:
        """(the shard file, the offset in it) of the token at `position` of the stream."""
        k = int(np.searchsorted(self.ends, position, side="right"))
        k = min(k, len(self.files) - 1)
        return self.files[k], position - (int(self.ends[k - 1]) if k else 0)

    def read_into(self, out: np.ndarray, start: int) -> None:
        """Fill `out` (any integer dtype) with the `len(out)` tokens from `start`, across shards."""
        n = len(out)
        if start < 0 or start + n > len(self):
            raise ValueError(f"{self.where}: tokens {start}..{start + n} run past the end ({len(self)} tokens)")
        k = int(np.searchsorted(self.ends, start, side="right"))
        done = 0
        while done < n:
            first = int(self.ends[k - 1]) if k else 0
            offset = start + done - first
            take = min(n - done, int(self.ends[k]) - first - offset)
            shard = self._shard(k)
            piece = shard[offset : offset + take]
            if len(piece) != take:  # the file shrank under the run
                raise ValueError(
                    f"{self.files[k]}: holds {len(shard)} tokens, fewer than the {offset + take} read "
                    "(was it truncated?)"
                )
            out[done : done + take] = piece
            done, k = done + take, k + 1

    def read(self, start: int, n: int) -> np.ndarray:
        """The `n` tokens from `start`, as int64."""
        out = np.empty(n, dtype=np.int64)
        self.read_into(out, start)
        return out

    def gather(self, starts: Sequence[int], n: int) -> np.ndarray:
        """The `n` tokens from each of `starts`, as an int64 [len(starts), n] array: a micro-batch of
        windows in one pass (one copy per window, straight into the batch)."""
        out = np.empty((len(starts), n), dtype=np.int64)
        for row, start in enumerate(starts):
            self.read_into(out[row], int(start))
        return out
