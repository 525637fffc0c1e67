"""Character-level language modelling from one UTF-8 `.txt` file (the nanoGPT Shakespeare setup).

The vocabulary is the sorted set of characters in the file (`data.vocab_size`, when set, must hold
it: a larger one only widens the model's embedding table). The text is cut into consecutive
windows of `data.seq_len + 1` characters (stride `seq_len`): x is the first `seq_len`, y the same
shifted by one. The split is contiguous — train, then val, then test, in file order — so the
held-out text is text the model has not seen, not windows interleaved with training ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gputrain.config.paths import check_data_path
from gputrain.config.schema import DataConfig
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError, DataError


def contiguous_split(num_windows: int, val_fraction: float, test_fraction: float) -> tuple[range, range, range]:
    """Window index ranges (train, val, test) in order, sized by the fractions."""
    n_val, n_test = round(num_windows * val_fraction), round(num_windows * test_fraction)
    n_train = num_windows - n_val - n_test
    return range(n_train), range(n_train, n_train + n_val), range(n_train + n_val, num_windows)


def read_text(path: Path) -> str:
    """The file's text (UTF-8; a byte-order mark is not a character of it; CRLF reads as LF).

    Raises:
        DataError: naming the file, and the byte and line of the first that is not UTF-8.
    """
    raw = path.read_bytes()
    body = raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        line = body[: err.start].count(b"\n") + 1
        raise DataError(
            f"{path}: not UTF-8 text (byte {err.start + len(raw) - len(body)}, line {line}); "
            "data.name=text reads UTF-8 .txt files"
        ) from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text:
        raise DataError(f"{path}: the file is empty")
    return text


def char_windows(text: str, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(x [N, seq_len], y [N, seq_len] as int64 ids, vocabulary) for the consecutive windows of `text`."""
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
    num_windows = (len(ids) - 1) // seq_len
    used = num_windows * seq_len
    return ids[:used].view(num_windows, seq_len), ids[1 : used + 1].view(num_windows, seq_len), vocab


@register_data("text")
def build_text(config: DataConfig, seed: int) -> DataBundle:
    if config.path is None:
        raise ConfigError("data.path", "data.name=text needs the path of a UTF-8 .txt file")
    check_data_path(config)
    path = Path(config.path)
    if config.task not in ("auto", "lm"):
        raise ConfigError("data.task", "text data is for language modelling (lm)", config.task)
    x, y, vocab = char_windows(read_text(path), config.seq_len)
    vocab_size = len(vocab)
    if config.vocab_size is not None:
        if config.vocab_size < len(vocab):
            raise DataError(
                f"{path}: {len(vocab)} distinct characters (ids 0..{len(vocab) - 1}, the largest "
                f"{vocab[-1]!r}), more than data.vocab_size = {config.vocab_size}; text gives each character an "
                "id: leave data.vocab_size unset, or at least the number of distinct characters"
            )
        vocab_size = config.vocab_size
    train, val, test = contiguous_split(len(x), config.val_fraction, config.test_fraction)
    if len(train) == 0:
        raise DataError(
            f"{path}: too short for data.seq_len={config.seq_len}: {len(x)} windows of "
            f"{config.seq_len + 1} characters leave none for training; use a smaller data.seq_len"
        )
    spec = DataSpec(task="lm", input_shape=(config.seq_len,), vocab_size=vocab_size)

    def part(r: range) -> TensorData | None:
        return TensorData(x[r.start : r.stop], y[r.start : r.stop]) if len(r) else None

    return DataBundle(train=part(train), val=part(val), test=part(test), spec=spec)  # type: ignore[arg-type]
