"""A split's token stream written as shards (contract §3): raw little-endian ids, `shard_tokens` a shard,
the stream cut where a shard is full (a document may span two). While the work goes on a shard is
`NAME.bin.part`; `finish` renames every shard to `NAME.bin` once the split is whole.

What the writer has written is told by `SplitCount` (saved in the resume state after every batch):
on a resume, the open shard is cut back to the tokens counted, so tokens written after the last
saved state (a kill between the two) are written again, once.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from gputrain.checksum import sha256_of

PART = ".part"


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.bin"


def dtype_for(vocab_size: int) -> str:
    """uint16 where every id fits (vocab_size <= 65536), else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


@dataclass
class SplitCount:
    """What a split holds so far: its totals, its full shards, and the tokens of the open one."""

    tokens: int = 0
    documents: int = 0
    bytes: int = 0
    shards: list[dict[str, Any]] = field(default_factory=list)
    """Full shards: {"file", "tokens", "sha256"}."""
    open_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> SplitCount:
        return SplitCount(**data)


def _either(out: Path, name: str) -> Path:
    """A shard under its working name, or under its final one (a kill while `finish` renamed) put back."""
    part = out / (name + PART)
    if not part.exists() and (out / name).exists():
        (out / name).replace(part)
    return part


class SplitWriter:
    """Appends a split's ids to its shards (module docstring)."""

    def __init__(self, out: Path, split: str, dtype: str, shard_tokens: int, count: SplitCount) -> None:
        self.out = out
        self.split = split
        self.itemsize = np.dtype(dtype).itemsize
        self.shard_tokens = shard_tokens
        self.count = count
        self._file: IO[bytes] | None = None
        for shard in count.shards:
            _either(out, shard["file"])

    def _open(self) -> IO[bytes]:
        if self._file is None:
            path = _either(self.out, shard_name(self.split, len(self.count.shards)))
            self._file = path.open("r+b" if path.exists() else "wb")
            self._file.truncate(self.count.open_tokens * self.itemsize)  # what the last state did not count
            self._file.seek(0, os.SEEK_END)
        return self._file

    def write(self, ids: bytes, documents: int, text_bytes: int) -> None:
        """Append `ids` (the split's dtype, raw) of `documents` documents of `text_bytes` UTF-8 bytes."""
        self.count.documents += documents
        self.count.bytes += text_bytes
        view = memoryview(ids)
        while len(view):
            room = (self.shard_tokens - self.count.open_tokens) * self.itemsize
            part, view = view[:room], view[room:]
            self._open().write(part)
            self.count.open_tokens += len(part) // self.itemsize
            self.count.tokens += len(part) // self.itemsize
            if self.count.open_tokens == self.shard_tokens:
                self._close_shard()

    def _close_shard(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None
        name = shard_name(self.split, len(self.count.shards))
        self.count.shards.append(
            {"file": name, "tokens": self.count.open_tokens, "sha256": sha256_of(self.out / (name + PART))}
        )
        self.count.open_tokens = 0

    def flush(self) -> None:
        """What was written reaches the file (the resume state is saved after this)."""
        if self._file is not None:
            self._file.flush()

    def finish(self) -> dict[str, Any]:
        """Close the last shard, give every shard its final name; the split's manifest entry."""
        if self.count.open_tokens:
            self._open()
            self._close_shard()
        if self._file is not None:  # an empty part opened for nothing
            self._file.close()
            self._file = None
        (self.out / (shard_name(self.split, len(self.count.shards)) + PART)).unlink(missing_ok=True)
        for shard in self.count.shards:
            _either(self.out, shard["file"]).replace(self.out / shard["file"])
        return {
            "tokens": self.count.tokens,
            "documents": self.count.documents,
            "bytes": self.count.bytes,
            "shards": self.count.shards,
        }

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
