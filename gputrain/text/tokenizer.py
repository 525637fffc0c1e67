"""Tokenizers, offline: text <-> the token ids a language model reads, of three kinds behind one class.

- "hf": a Hugging Face `tokenizer.json` (a file, or a model directory holding one, with its
  `tokenizer_config.json` beside for the end-of-document token and the chat template), read by the
  `tokenizers` library.
- "tiktoken": a local `.tiktoken` file, tiktoken's own format: one `<base64 token bytes> <rank>`
  line per token. Its split pattern and special tokens are not in that file: they come from a
  sibling JSON of the same stem (`enc.tiktoken` + `enc.json`: `{"pattern": "...",
  "special_tokens": {"<|endoftext|>": 50256}}`), or, without one, from the standard files' known
  names (gpt2, r50k_base, p50k_base, cl100k_base, o200k_base: `cl100k_base.tiktoken`). Encoded with
  the `tiktoken` library.
- "bpe": a byte-level BPE trained on the user's corpus by `train_bpe` (a `tokenizer.json` too).

Nothing is ever downloaded. `encode` adds no special tokens (no BOS/EOS around the text). Text that
spells one ("<|endoftext|>" in a document) is the special id for a tokenizer.json (the tokenizers
library always reads its added tokens in text) and plain text for tiktoken (`encode_ordinary`).

The hash ("sha256:<hex>") is of the canonical bytes that decide what the ids mean: the
tokenizer.json as it is on disk, or the .tiktoken file followed by the canonical JSON of its pattern
and special tokens. A run, a prepared folder and a shard name their tokenizer by it.

`Tokenizer.save(directory)` writes `directory/tokenizer/`: the file(s) and `tokenizer_meta.json`
({kind, hash, vocab_size, eos_id}); `load_tokenizer` reads such a folder back, checking the files
against the recorded hash. Bad input is one DataError line naming the path.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gputrain.config.paths import kind_of
from gputrain.errors import DataError, UsageError, first_line
from gputrain.run.layout import TOKENIZER as TOKENIZER_DIR  # the folder `Tokenizer.save` writes

META = "tokenizer_meta.json"
HF_FILE = "tokenizer.json"
HF_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
TIKTOKEN_FILE = "encoding.tiktoken"
TIKTOKEN_SPECIALS = "encoding.json"
"""A saved tiktoken tokenizer's files: the ranks as given, and the pattern and special tokens."""
MAX_FILE_BYTES = 1 << 30
"""The largest tokenizer file read (the largest real ones are tens of MB)."""
LM_EXTRA_HINT = "pip install 'gputrain[lm]'"
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
"""The end-of-document tokens looked for where a tokenizer_config.json names none."""

_R50K = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|"""
    r"""\s+(?!\S)|\s"""
)
_O200K = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
KNOWN_TIKTOKEN: dict[str, tuple[str, dict[str, int]]] = {
    "gpt2": (_R50K, {"<|endoftext|>": 50256}),
    "r50k_base": (_R50K, {"<|endoftext|>": 50256}),
    "p50k_base": (_R50K, {"<|endoftext|>": 50256}),
    "cl100k_base": (
        _CL100K,
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": (_O200K, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
}
"""tiktoken's standard encodings (tiktoken_ext/openai_public.py): the pattern and special tokens of
a `.tiktoken` file of that name where no sibling JSON gives them."""


def _require(module: str, what: str) -> Any:
    """The optional package `module`, or a UsageError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{what} needs the {module} package, not installed: {LM_EXTRA_HINT}") from None


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _read(path: Path, what: str) -> bytes:
    """A tokenizer file's bytes: a regular file (links followed), not empty, of a bounded size."""
    kind = kind_of(path)
    if kind is None:
        raise DataError(f"{path}: no such {what}")
    if kind != "a regular file":
        raise DataError(f"{path}: is {kind}, not a {what}")
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{path}: is empty, not a {what}")
    if size > MAX_FILE_BYTES:
        raise DataError(f"{path}: {size:,} bytes, larger than any {what} (at most {MAX_FILE_BYTES:,})")
    try:
        return path.read_bytes()
    except OSError as err:
        raise DataError(f"{path}: cannot be read ({err.strerror or err})") from None


def _json(path: Path, data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path}: not JSON ({first_line(err, 80)}), so not a {what}") from None


class Tokenizer:
    """Text <-> token ids, of one of three kinds (module docstring). Made by `load_tokenizer` or
    `train_bpe`, not directly."""

    kind: str
    """"hf" (a tokenizer.json), "tiktoken" or "bpe" (trained by train_bpe: a tokenizer.json too)."""
    vocab_size: int
    """Every id it gives or reads is below it (special tokens included)."""
    eos_id: int | None
    """The end-of-document token's id, where it has one."""
    hash: str
    """"sha256:<hex>" of its canonical bytes (module docstring)."""
    source: str
    """Where it was loaded from, for messages."""
    chat_template: str | None
    """The chat template of a tokenizer_config.json beside its tokenizer.json, where there is one."""

    def __init__(
        self,
        kind: str,
        backend: Any,
        files: dict[str, bytes],
        *,
        vocab_size: int,
        eos_id: int | None,
        source: str,
        chat_template: str | None = None,
    ) -> None:
        self.kind, self._backend, self._files = kind, backend, files
        self.vocab_size, self.eos_id, self.source, self.chat_template = vocab_size, eos_id, source, chat_template
        self.hash = _sha256(b"".join(files.values()))  # in the order given: the canonical bytes

    def __repr__(self) -> str:
        shown = f"kind={self.kind!r}, vocab_size={self.vocab_size}, hash={self.hash[:19]}..., source={self.source!r}"
        return f"Tokenizer({shown})"

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, no special tokens added (nor read from the text)."""
        if self.kind == "tiktoken":
            return list(self._backend.encode_ordinary(text))
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text, in one call to the library (its threads)."""
        if self.kind == "tiktoken":
            return [list(ids) for ids in self._backend.encode_ordinary_batch(list(texts))]
        return [list(e.ids) for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens spelled out; bytes that are not whole UTF-8 characters
        (a cut inside a character) become U+FFFD."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise DataError(f"token id {bad} is outside the tokenizer's vocabulary (0..{self.vocab_size - 1})")
        if self.kind == "tiktoken":
            return str(self._backend.decode(ids, errors="replace"))
        return str(self._backend.decode(ids, skip_special_tokens=False))

    def save(self, directory: Path) -> Path:
        """Write `directory/tokenizer/` (its file(s), tokenizer_meta.json, and tokenizer_config.json
        with the chat template where there is one); returns that folder. The files are written
        whole (a temporary file renamed), so a reader never sees half of one."""
        folder = Path(directory) / TOKENIZER_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.write_files(folder)
        return folder

    def write_files(self, folder: Path) -> list[str]:
        """Write what `save` writes into `folder` itself (an export's folder, beside the model);
        returns the names written. `load_tokenizer(folder)` reads them back."""
        files = dict(self._files)
        if self.chat_template is not None:
            files[HF_CONFIG] = _canonical({"chat_template": self.chat_template})
        meta = {"kind": self.kind, "hash": self.hash, "vocab_size": self.vocab_size, "eos_id": self.eos_id}
        files[META] = _canonical(meta)  # last: a folder with its record holds the files it vouches for
        for name, data in files.items():
            _write(folder / name, data)
        return list(files)


def _write(path: Path, data: bytes) -> None:
    from gputrain.run.files import write_bytes

    write_bytes(path, data)


def _canonical(value: Any) -> bytes:
    return (json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


# ----------------------------------------------------------------- loading


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer at `path`: a tokenizer.json; a directory holding one (a Hugging Face model
    directory) or a folder `Tokenizer.save` wrote (tokenizer_meta.json); a `.tiktoken` file.

    Raises:
        DataError: one line naming the path: nothing there, not a tokenizer, a saved folder whose
            files no longer match their hash.
        UsageError: the library the kind needs is not installed.
    """
    path = Path(path).expanduser()
    kind = kind_of(path)
    if kind is None:
        raise DataError(
            f"{path}: no such tokenizer (give a tokenizer.json, a model directory holding one, or a .tiktoken file)"
        )
    if kind == "a directory":
        if (path / META).exists() or (path / TOKENIZER_DIR / META).exists():
            return _load_saved(path if (path / META).exists() else path / TOKENIZER_DIR)
        if (path / HF_FILE).exists():
            return _load_hf(path / HF_FILE)
        raise DataError(
            f"{path}: a directory without a {HF_FILE} (nor a saved tokenizer's {META}): give the tokenizer's file, "
            "or a model directory holding one"
        )
    if path.suffix == ".tiktoken":
        return _load_tiktoken(path)
    return _load_hf(path)


def _load_hf(path: Path, kind: str = "hf") -> Tokenizer:
    data = _read(path, "tokenizer.json")
    parsed = _json(path, data, "tokenizer.json")
    if not isinstance(parsed, dict) or "model" not in parsed:
        raise DataError(f'{path}: JSON without a tokenizer\'s "model": not a tokenizers tokenizer.json')
    tokenizers = _require("tokenizers", "a tokenizer.json")
    try:
        backend = tokenizers.Tokenizer.from_str(data.decode())
    except Exception as err:  # noqa: BLE001 (the library raises a bare Exception for a JSON it cannot read)
        raise DataError(f"{path}: not a tokenizer the tokenizers library reads ({first_line(err, 120)})") from None
    vocab = backend.get_vocab(with_added_tokens=True)
    if not vocab:
        raise DataError(f"{path}: a tokenizer without any token")
    config = _hf_config(path.parent / HF_CONFIG)
    return Tokenizer(
        kind,
        backend,
        {HF_FILE: data},
        vocab_size=max(vocab.values()) + 1,
        eos_id=_hf_eos(vocab, config),
        source=str(path),
        chat_template=_chat_template(config, path.parent),
    )


def _hf_config(path: Path) -> dict[str, Any]:
    """tokenizer_config.json beside a tokenizer.json, where there is one (it is optional: one that
    cannot be read is a DataError all the same, not silently left out)."""
    if not path.exists():
        return {}
    config = _json(path, _read(path, HF_CONFIG), HF_CONFIG)
    if not isinstance(config, dict):
        raise DataError(f"{path}: not a JSON object, so not a {HF_CONFIG}")
    return config


def _hf_eos(vocab: dict[str, int], config: dict[str, Any]) -> int | None:
    named = config.get("eos_token")
    if isinstance(named, dict):
        named = named.get("content")
    if isinstance(named, str) and named in vocab:
        return vocab[named]
    return next((vocab[name] for name in EOS_NAMES if name in vocab), None)


def _chat_template(config: dict[str, Any], directory: Path) -> str | None:
    """tokenizer_config.json's chat template, else a chat_template.jinja beside it (where transformers
    4.43 and later save it)."""
    template = config.get("chat_template")
    jinja = directory / CHAT_TEMPLATE
    if template is None and jinja.is_file():
        try:
            template = _read(jinja, CHAT_TEMPLATE).decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(
                f"{jinja}: not UTF-8 text ({err.reason} at byte {err.start}), so not a chat template"
            ) from None
    if isinstance(template, list):  # several named templates: the default one
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    return template if isinstance(template, str) else None


def _load_saved(folder: Path) -> Tokenizer:
    """A folder Tokenizer.save wrote: its files, checked against the hash it recorded."""
    meta = _json(folder / META, _read(folder / META, META), META)
    if not isinstance(meta, dict) or meta.get("kind") not in ("hf", "bpe", "tiktoken"):
        raise DataError(f"{folder / META}: not a saved tokenizer's record (no kind hf, bpe or tiktoken)")
    if meta["kind"] == "tiktoken":
        tokenizer = _load_tiktoken(folder / TIKTOKEN_FILE, folder / TIKTOKEN_SPECIALS)
    else:
        tokenizer = _load_hf(folder / HF_FILE, meta["kind"])
    if tokenizer.hash != meta.get("hash"):
        raise DataError(
            f"{folder}: its tokenizer files' hash {tokenizer.hash} is not the {meta.get('hash')} recorded in {META}: "
            "they were changed since it was saved"
        )
    eos = meta.get("eos_id")
    if eos is not None and (type(eos) is not int or not 0 <= eos < tokenizer.vocab_size):
        ids = f"0..{tokenizer.vocab_size - 1}"
        raise DataError(f"{folder / META}: eos_id {eos!r} is not an id of the tokenizer ({ids})")
    # the end-of-document id as it was decided where the tokenizer came from (its own
    # tokenizer_config.json's eos_token, which the saved folder does not keep)
    tokenizer.eos_id, tokenizer.source = eos, str(folder)
    return tokenizer


def _load_tiktoken(path: Path, specials_path: Path | None = None) -> Tokenizer:
    data = _read(path, ".tiktoken file")
    ranks = _tiktoken_ranks(path, data)
    specials_path = specials_path or path.with_suffix(".json")
    if specials_path.exists():
        pattern, specials = _tiktoken_specials(specials_path)
    elif path.stem in KNOWN_TIKTOKEN:
        pattern, specials = KNOWN_TIKTOKEN[path.stem]
    else:
        raise DataError(
            f"{path}: a .tiktoken file holds no split pattern nor special tokens: give them in {specials_path.name} "
            '({"pattern": "...", "special_tokens": {"<|endoftext|>": ID}}), or use a standard name '
            f"({', '.join(KNOWN_TIKTOKEN)})"
        )
    clash = sorted(set(specials.values()) & set(ranks.values()))
    if clash:
        raise DataError(f"{path}: special token id {clash[0]} is also a rank of the file")
    tiktoken = _require("tiktoken", "a .tiktoken tokenizer")
    try:
        backend = tiktoken.Encoding(path.stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    except ValueError as err:  # a pattern the regex engine refuses
        raise DataError(f"{path}: tiktoken cannot build an encoding from it ({first_line(err, 120)})") from None
    settings = _canonical({"pattern": pattern, "special_tokens": specials})
    return Tokenizer(
        "tiktoken",
        backend,
        {TIKTOKEN_FILE: data, TIKTOKEN_SPECIALS: settings},
        vocab_size=int(backend.max_token_value) + 1,
        eos_id=specials.get("<|endoftext|>"),
        source=str(path),
    )


def _tiktoken_ranks(path: Path, data: bytes) -> dict[bytes, int]:
    """tiktoken's format: `<base64 token> <rank>` per line (what tiktoken.load reads, checked line by line)."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error):
            shown = line[:40].decode("utf-8", errors="replace")
            raise DataError(
                f"{path}: line {number} ({shown!r}) is not '<base64 token> <rank>': not a .tiktoken file"
            ) from None
        if rank < 0 or token in ranks or not token:
            raise DataError(f"{path}: line {number}: an empty, repeated or negative-ranked token")
        ranks[token] = rank
    if not ranks:
        raise DataError(f"{path}: holds no token")
    if len(set(ranks.values())) != len(ranks):
        raise DataError(f"{path}: two tokens share a rank")
    return ranks


def _tiktoken_specials(path: Path) -> tuple[str, dict[str, int]]:
    given = _json(path, _read(path, "special tokens JSON"), "tiktoken settings file")
    pattern = given.get("pattern") if isinstance(given, dict) else None
    specials = given.get("special_tokens", {}) if isinstance(given, dict) else None
    if (
        not isinstance(pattern, str)
        or not isinstance(specials, dict)
        or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in specials.items())
    ):
        raise DataError(
            f'{path}: must be {{"pattern": "<split regex>", "special_tokens": {{"<|endoftext|>": ID, ...}}}}'
        )
    return pattern, dict(specials)


# ----------------------------------------------------------------- training


def train_bpe(texts: Iterable[str], vocab_size: int, *, eos: str = "<|endoftext|>") -> Tokenizer:
    """A byte-level BPE of at most `vocab_size` tokens (fewer where the corpus has fewer merges),
    trained on `texts` with the `tokenizers` library: `eos` is id 0, the 256 bytes follow, then the
    merges. The same texts give the same tokenizer.json, byte for byte.

    Raises:
        UsageError: a vocab_size below 257 (the bytes and the eos) or above 2**32.
    """
    if not 257 <= vocab_size <= 1 << 32:
        raise UsageError(f"vocab_size {vocab_size}: a byte-level BPE needs 257..{1 << 32} (256 bytes and the eos)")
    tokenizers = _require("tokenizers", "training a BPE tokenizer")
    byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = byte_level
    backend.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eos],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    data = backend.to_str().encode()
    vocab = backend.get_vocab(with_added_tokens=True)
    return Tokenizer(
        "bpe", backend, {HF_FILE: data}, vocab_size=max(vocab.values()) + 1, eos_id=vocab[eos], source="train_bpe"
    )
