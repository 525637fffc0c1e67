"""Writers of small real data files (IDX, image folders, text, uint16 tokens) for the tests."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def write_idx(path: Path, array: np.ndarray, *, magic: int | None = None, gz: bool = False) -> Path:
    """An IDX file of unsigned bytes, as MNIST distributes them (big-endian header)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = (magic if magic is not None else (0x08 << 8) | array.ndim).to_bytes(4, "big")
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def mnist_like(n: int, seed: int, size: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """Images whose class is where a bright square sits (learnable in a few steps), and their labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 40, (n, size, size)).astype(np.uint8)
    cell = size // 4
    for i, label in enumerate(labels):
        r, c = divmod(int(label), 4)
        images[i, r * cell:(r + 1) * cell, c * cell:(c + 1) * cell] = 255
    return images, labels


def write_mnist(folder: Path, n_train: int = 256, n_test: int = 64, gz: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        images, labels = mnist_like(n, seed)
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, gz=gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels, gz=gz)
    return folder


def write_image_folder(root: Path, classes: int = 3, per_class: int = 12, size: tuple[int, int] = (20, 14),
                       fmt: str = "png") -> Path:
    """Class k: images tinted towards colour channel k, with noise; sizes vary to exercise the resize."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for k in range(classes):
        (root / f"class_{k}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = size[0] + i % 3, size[1] + 2 * (i % 2)
            pixels = rng.integers(0, 90, (h, w, 3)).astype(np.uint8)
            pixels[:, :, k % 3] = 200 + rng.integers(0, 55, (h, w))
            Image.fromarray(pixels).save(root / f"class_{k}" / f"img_{i}.{fmt}")
    return root


def write_text(path: Path, n_chars: int = 6000) -> Path:
    """A repetitive English-like text a tiny model learns quickly."""
    phrase = "the quick brown fox jumps over the lazy dog. "
    text = (phrase * (n_chars // len(phrase) + 1))[:n_chars]
    path.write_text(text, encoding="utf-8")
    return path


def write_tokens(path: Path, n_tokens: int, vocab: int = 50, seed: int = 0) -> Path:
    """uint16 ids following next = (3·prev + 1) mod vocab, with rare random restarts."""
    rng = np.random.default_rng(seed)
    tokens = np.empty(n_tokens, dtype=np.uint16)
    tokens[0] = 0
    for i in range(1, n_tokens):
        tokens[i] = rng.integers(vocab) if rng.random() < 0.02 else (3 * int(tokens[i - 1]) + 1) % vocab
    tokens.tofile(path)
    return path
