"""A file's SHA-256, read a MiB at a time (hashlib.file_digest is Python 3.11's): what checkpoints'
and prepared corpora's manifests record. Torch-free, so `gputrain prepare` does not load torch."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: Path) -> str:
    """The file's SHA-256, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
