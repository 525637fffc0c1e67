"""STAND-IN, TO BE SWAPPED AT MERGE: the run's tokenizer as issue 30's contract (§1) names it.

Part T owns `gputrain/text/tokenizer.py` (`Tokenizer`, `load_tokenizer`). Until it is in this
branch, the instruction and text-class sources read their tokenizer through this module, a small
adapter over the `tokenizers` library giving the subset of that interface they use: `encode`
(no special tokens added), `encode_batch`, `decode`, `vocab_size`, `eos_id`, `chat_template` and `source`. At merge this
module becomes `from gputrain.text.tokenizer import Tokenizer, load_tokenizer` (its only importers
are data/instructions.py and data/text_classes.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.errors import DataError

_EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[EOS]")
"""Special tokens taken as the end of a document, where tokenizer_config.json names no eos_token."""


@dataclass(frozen=True, slots=True)
class Tokenizer:
    """A Hugging Face `tokenizer.json` loaded through the `tokenizers` library."""

    backend: Any
    vocab_size: int
    eos_id: int | None
    chat_template: str | None
    source: str

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return str(self.backend.decode(ids, skip_special_tokens=False))


def _config(directory: Path) -> dict[str, Any]:
    file = directory / "tokenizer_config.json"
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{file}: not a JSON tokenizer config ({err})") from None
    if not isinstance(config, dict):
        raise DataError(f"{file}: not a JSON object")
    return config


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json file, or a directory holding one (and perhaps tokenizer_config.json).

    Raises:
        DataError: one line naming the path and what is wrong.
    """
    path = Path(path).expanduser()
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise DataError(f"data.tokenizer: no tokenizer.json at {path}")
    try:
        from tokenizers import Tokenizer as Backend
    except ImportError:
        raise DataError("data.tokenizer needs the tokenizers library: pip install 'gputrain[lm]'") from None
    try:
        backend = Backend.from_file(str(file))
    except Exception as err:  # noqa: BLE001 — the library raises bare Exceptions for files it cannot read
        raise DataError(f"data.tokenizer: {file} is not a tokenizer.json ({str(err).splitlines()[0][:200]})") from None
    config = _config(file.parent)
    special = {k: t for k, v in config.items() if k.endswith("_token") and (t := _token_text(v)) is not None}
    eos_id = None
    for name in ([special["eos_token"]] if "eos_token" in special else []) + list(_EOS_NAMES):
        eos_id = backend.token_to_id(name)
        if eos_id is not None:
            break
    template = config.get("chat_template")
    jinja = file.parent / "chat_template.jinja"  # where transformers >= 4.43 saves it
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    if isinstance(template, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return Tokenizer(
        backend=backend,
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
        eos_id=eos_id,
        chat_template=template if isinstance(template, str) else None,
        source=str(file),
    )
