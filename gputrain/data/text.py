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
    check_not_binary(path, body, len(raw) - len(body))
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


_WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32-LE"),
    (b"\x00\x00\xfe\xff", "UTF-32-BE"),
    (b"\xff\xfe", "UTF-16-LE"),
    (b"\xfe\xff", "UTF-16-BE"),
)


def wide_encoding(head: bytes) -> str | None:
    """The UTF-16/32 encoding `head` (a file's first bytes) is in, from its byte-order mark or, without
    one, from where its zero bytes fall (the high bytes of Latin text in UTF-16 are all zero); None."""
    for bom, name in _WIDE_BOMS:
        if head.startswith(bom):
            return f"{name} (byte-order mark)"
    n = len(head) - len(head) % 4
    if n < 8:
        return None
    columns = [head[i:n:4] for i in range(4)]
    zero = [c.count(0) / len(c) for c in columns]
    if zero[1] > 0.9 and zero[2] > 0.9 and zero[3] > 0.9 and zero[0] < 0.5:
        return "UTF-32-LE"
    if zero[0] > 0.9 and zero[1] > 0.9 and zero[2] > 0.9 and zero[3] < 0.5:
        return "UTF-32-BE"
    odd, even = (zero[1] + zero[3]) / 2, (zero[0] + zero[2]) / 2
    if odd > 0.9 and even < 0.5:
        return "UTF-16-LE"
    if even > 0.9 and odd < 0.5:
        return "UTF-16-BE"
    return None


def check_not_binary(path: Path, body: bytes, offset: int = 0) -> None:
    """Text has no NUL byte: refuse UTF-16/32 text (whose every other character would be a NUL
    "character" of the vocabulary) and binary data, naming what the file looks like.

    Raises:
        DataError: naming the file, the first NUL byte (and its line) and what the file seems to be.
    """
    wide = wide_encoding(body[:4096])
    if wide is not None:
        raise DataError(
            f"{path}: {wide} text, not UTF-8; data.name=text reads UTF-8 .txt files: convert it "
            f"(e.g. iconv -f {wide.split()[0]} -t UTF-8)"
        )
    nul = body.find(b"\0")
    if nul >= 0:
        line = body[:nul].count(b"\n") + 1
        raise DataError(
            f"{path}: a NUL byte at byte {nul + offset} (line {line}): binary data, not text; data.name=text "
            "reads UTF-8 .txt files (token ids in a .bin file: data.name=tokens)"
        )


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

    training = part(train)
    assert training is not None  # a text too short for one training window was refused above
    return DataBundle(train=training, val=part(val), test=part(test), spec=spec)
