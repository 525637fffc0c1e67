"""The tokenizer a run keeps: `RUN/tokenizer/` (layout.py's TOKENIZER, written by text/tokenizer.py's
`Tokenizer.save`), so that the run's token ids keep their meaning after the data moves, and the use
commands (generate, evaluate, export) speak text.

Written once, by rank 0, at the run's start (run/start.py), with its hash in env.json. A run that
continues one whose tokenizer had another hash is refused before anything is written: its
checkpoint's ids would mean other text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputrain.errors import UsageError
from gputrain.run.files import run_dir_option
from gputrain.run.layout import TOKENIZER
from gputrain.run.reader import RunFileError, read_bytes, run_entry

if TYPE_CHECKING:
    from gputrain.text.tokenizer import Tokenizer

META = f"{TOKENIZER}/tokenizer_meta.json"
"""The saved tokenizer's record, relative to the run directory (text/tokenizer.py's META)."""


def stored_hash(run_dir: Path) -> str | None:
    """The hash of the tokenizer `run_dir` keeps, or None where it keeps none.

    Raises:
        RunFileError: its tokenizer/ is not a folder inside the run, or its record cannot be read.
    """
    if run_entry(run_dir, TOKENIZER, directory=True) is None:
        return None
    data = read_bytes(run_dir, META, 1 << 20)
    if data is None:
        return None
    try:
        meta = json.loads(data)
    except ValueError:
        meta = None
    found = meta.get("hash") if isinstance(meta, dict) else None
    if not isinstance(found, str):
        raise RunFileError(f'{run_dir / META}: not a saved tokenizer\'s record (no "hash")')
    return found


def check_same_tokenizer(run_dir: Path, tokenizer: Tokenizer | None, owned: bool) -> None:
    """A run continuing the one `run_dir` holds (`owned`: it is that run's) reads its ids with the
    same tokenizer.

    Raises:
        UsageError: naming both hashes and where each tokenizer is.
    """
    if tokenizer is None or not owned:
        return
    stored = stored_hash(run_dir)
    if stored is not None and stored != tokenizer.hash:
        raise UsageError(
            f"{run_dir_option()} {run_dir}: its run was trained with the tokenizer in {run_dir / TOKENIZER} "
            f"({stored[:19]}...), and this one ({tokenizer.source}) is another ({tokenizer.hash[:19]}...): the "
            f"checkpoint's token ids would mean other text; put the run's tokenizer back (a copy is in "
            f"{run_dir / TOKENIZER}), or choose another {run_dir_option()} for a new run"
        )


def store_tokenizer(run_dir: Path, tokenizer: Tokenizer) -> dict[str, Any]:
    """Write `run_dir/tokenizer/` where it is not there with this hash already; returns what env.json
    records of it."""
    if stored_hash(run_dir) != tokenizer.hash:
        tokenizer.save(run_dir)
    return {
        "dir": TOKENIZER,
        "kind": tokenizer.kind,
        "hash": tokenizer.hash,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": tokenizer.eos_id,
    }


def read_run_tokenizer(run_dir: Path) -> Tokenizer | None:
    """The tokenizer the run keeps (checked against its recorded hash), or None where it keeps none.

    Raises:
        RunFileError / DataError: its tokenizer/ is a file, a link out, or its files were changed.
    """
    if stored_hash(run_dir) is None:
        return None
    from gputrain.text.tokenizer import HF_CONFIG, HF_FILE, TIKTOKEN_FILE, TIKTOKEN_SPECIALS, load_tokenizer

    for name in (HF_FILE, HF_CONFIG, TIKTOKEN_FILE, TIKTOKEN_SPECIALS):
        run_entry(run_dir, f"{TOKENIZER}/{name}")  # the run's rules: a regular file inside it, never a link out

    return load_tokenizer(run_dir / TOKENIZER)
