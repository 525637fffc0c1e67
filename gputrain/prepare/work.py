"""`gputrain prepare`'s work, from SOURCES to a prepared folder (contract §3), resumable.

The order: every check that needs no writing first (options, sources, --out, each file's start,
the sources' checksums, a record already in --out); then the tokenizer (loaded, or trained on the
corpus) saved as OUT/tokenizer; then the documents, in order, in batches through the pool
(encode.py) into the shards (shards.py), the resume state saved after every batch; last the
manifest, and the state removed.

A rerun of the same command: on a complete folder, leaves it as it is; on an unfinished one (a kill,
a power cut after the state's last save), continues from the state's batch, the open shards cut back
to what the state counts, and ends with the bytes an unbroken run writes. Other sources or settings
are refused, and so are the same files changed since (manifest.py).

Bad data met in the middle (a line that is not JSON, a file that is not UTF-8, an empty corpus)
removes what this prepare wrote, so a refusal leaves nothing behind; an interrupt keeps it, to
continue.

`--train-tokenizer N` trains a byte-level BPE on the train split's documents (never val's), all of
them up to TRAIN_SAMPLE_BYTES of sources, above that a deterministic sample of that size (each
document drawn by the hash that splits train from val, `encode.draws`).
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputrain.disk_full import removed_if_failed
from gputrain.errors import DataError, Interrupted, UsageError
from gputrain.interrupts import StoppedAtOnce
from gputrain.prepare.encode import Batch, Encoding, draws, encoded
from gputrain.prepare.manifest import (
    MANIFEST,
    SOURCES,
    STATE,
    fingerprint,
    manifest,
    read_manifest,
    read_state,
    same_corpus,
    write_json,
    write_state,
)
from gputrain.prepare.progress import PrepareProgress
from gputrain.prepare.shards import PART, SplitCount, SplitWriter, dtype_for
from gputrain.prepare.sources import SourceFile, check, documents, expand
from gputrain.run.output import Owner, check_output_folder, make_folder, marked
from gputrain.text.tokenizer import Tokenizer, load_tokenizer, train_bpe

SPLITS = ("train", "val")
TOKENIZER_DIR = "tokenizer"
TOKENIZER_META = "tokenizer_meta.json"
"""What `Tokenizer.save(OUT)` writes (the contract's §1): OUT/tokenizer/, its record last."""
DEFAULT_SHARD_TOKENS = 100_000_000
BATCH_BYTES = 1 << 18
"""Text a batch of documents holds at most (one document more than this is a batch of its own):
small enough that the last batches keep every worker busy, large enough that a batch's passage
through the pool and the state saved after it cost little beside its tokenizing."""
BATCH_DOCUMENTS = 1024
TRAIN_SAMPLE_BYTES = 1 << 30
"""Source bytes a trained tokenizer sees at most (module docstring)."""
MIN_TRAINED_VOCAB = 257
"""A byte-level BPE holds the 256 bytes and the eos token at least."""
OUR_NAMES = (MANIFEST, STATE, SOURCES, TOKENIZER_DIR, "train-*.bin", "val-*.bin", f"*.bin{PART}", ".*.tmp-*")
"""Every name prepare writes in OUT (a temporary of `atomic` included)."""


@dataclass(frozen=True, slots=True)
class Options:
    sources: tuple[str, ...]
    out: str
    tokenizer: str | None = None
    train_tokenizer: int | None = None
    field: str = "text"
    column: str = "text"
    glob: str = "*.txt"
    val_fraction: float = 0.005
    seed: int = 0
    workers: int = 1
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    quiet: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    out: Path
    manifest: dict[str, Any]
    already: bool
    """The folder was complete already: left as it was."""


def _ours(folder: Path) -> bool:
    """A folder `prepare` wrote (a manifest, a resume state, or a start's saved tokenizer) holding nothing else."""
    names = [p.name for p in folder.iterdir()]
    mark = read_manifest(folder) or read_state(folder) or (folder / TOKENIZER_DIR / TOKENIZER_META).is_file()
    return bool(mark) and all(any(fnmatch.fnmatchcase(name, pattern) for pattern in OUR_NAMES) for name in names)


def _save_tokenizer(tokenizer: Tokenizer, out: Path) -> None:
    """OUT/tokenizer, whole or not at all (it marks OUT as prepare's before the first state is saved)."""
    staging = out / f".{TOKENIZER_DIR}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    with removed_if_failed(staging, TOKENIZER_DIR):  # a signal or a full disk meanwhile: no staging left
        folder = tokenizer.save(staging)
        if (out / TOKENIZER_DIR).is_dir():  # a start killed before its first state: begun again
            shutil.rmtree(out / TOKENIZER_DIR)
        folder.replace(out / TOKENIZER_DIR)
    staging.rmdir()


def _check_options(o: Options) -> None:
    if (o.tokenizer is None) == (o.train_tokenizer is None):
        raise UsageError("give --tokenizer PATH (a tokenizer.json) or --train-tokenizer N (a BPE of N tokens), one")
    if o.train_tokenizer is not None and not MIN_TRAINED_VOCAB <= o.train_tokenizer <= 1 << 32:
        raise UsageError(
            f"--train-tokenizer {o.train_tokenizer}: a byte-level BPE holds {MIN_TRAINED_VOCAB} to 2^32 tokens "
            "(the 256 bytes and <|endoftext|> at least); GPT-2's has 50257"
        )
    if not 0.0 <= o.val_fraction < 1.0:
        raise UsageError(f"--val-fraction {o.val_fraction}: give a fraction in [0, 1) (0: no val split)")
    if o.shard_tokens < 1:
        raise UsageError(f"--shard-tokens {o.shard_tokens}: give a positive number of tokens a shard")
    if o.workers < 1:
        raise UsageError(f"--workers {o.workers}: give a positive number of processes")
    for name, value in (("--field", o.field), ("--column", o.column), ("--glob", o.glob)):
        if not value:
            raise UsageError(f"{name}: empty; give a name")


def _settings(o: Options) -> dict[str, Any]:
    """What the ids depend on, besides the corpus (the workers do not: the bytes are the same)."""
    return {
        "field": o.field,
        "column": o.column,
        "glob": o.glob,
        "val_fraction": o.val_fraction,
        "seed": o.seed,
        "shard_tokens": o.shard_tokens,
        "tokenizer": str(Path(o.tokenizer).resolve()) if o.tokenizer else None,
        "train_tokenizer": o.train_tokenizer,
    }


def _texts(files: list[SourceFile], o: Options) -> Iterator[tuple[int, str, int]]:
    """Every non-empty document of the corpus in order: (its index, its text, the source bytes it took
    with the empty ones and the progress-only steps before it); then (-1, "", the bytes after the last)."""
    index = 0
    pending = 0
    for f in files:
        for text, took in documents(f, o.field, o.column):
            pending += took
            if text:
                yield index, text, pending
                index += 1
                pending = 0
    yield -1, "", pending


def _batches(files: list[SourceFile], o: Options, skip: int) -> Iterator[Batch]:
    """The documents from index `skip` on, in batches of BATCH_BYTES of text or BATCH_DOCUMENTS."""
    first, texts, size, took = skip, [], 0, 0
    for index, text, source_bytes in _texts(files, o):
        if 0 <= index < skip:
            continue
        took += source_bytes
        if index < 0:
            break
        texts.append(text)
        size += len(text)
        if size >= BATCH_BYTES or len(texts) >= BATCH_DOCUMENTS:
            yield first, texts, took
            first, texts, size, took = index + 1, [], 0, 0
    if texts or took:
        yield first, texts, took


def _trained(files: list[SourceFile], o: Options, total_bytes: int) -> Tokenizer:
    assert o.train_tokenizer is not None
    rate = min(1.0, TRAIN_SAMPLE_BYTES / max(total_bytes, 1))

    def sample() -> Iterator[str]:
        for index, text, _ in _texts(files, o):
            if index >= 0:
                to_val, drawn = draws(index, text.encode("utf-8"), o.seed)
                if to_val >= o.val_fraction and drawn < rate:
                    yield text

    return train_bpe(sample(), o.train_tokenizer)


def _remove_work(out: Path, created: bool) -> None:
    """Every file prepare wrote in `out` (it held nothing else), and `out` where this run made it."""
    for entry in out.iterdir():
        if any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in OUR_NAMES):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    if created:
        out.rmdir()


@contextlib.contextmanager
def _held(out: Path) -> Iterator[Callable[[], None]]:
    """A `take()` of an exclusive lock on the folder `out` (flock: the kernel drops it when the process
    ends, however it ends), held until the block ends: two prepares into one folder would write each
    other's shards.

    Raises:
        UsageError: another process holds `out`.
    """
    fds: list[int] = []

    def take() -> None:
        if fds:
            return
        fd = os.open(out, os.O_RDONLY)
        fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"--out {out}: another gputrain prepare is writing it; wait for it to end (or stop it) and "
                "run the same command again"
            ) from None

    try:
        yield take
    finally:
        for fd in fds:
            os.close(fd)


def _save_state(out: Path, state: dict[str, Any], *, first: bool = False) -> None:
    write_state(out, state, first=first)


def prepare(o: Options) -> Outcome:
    """SOURCES into a prepared folder (module docstring).

    Raises:
        UsageError: bad options, a bad --out, another corpus or tokenizer in --out.
        DataError: a bad source file or tokenizer, a corpus changed since prepare, an empty corpus.
        Interrupted: Ctrl-C; the same command continues.
    """
    _check_options(o)
    files = expand(list(o.sources), o.glob)
    out = check_output_folder(o.out, "--out", Owner.of(inputs=[*o.sources, o.tokenizer]), _ours)
    for f in files:
        check(f, o.field, o.column)
    given = load_tokenizer(o.tokenizer) if o.tokenizer else None
    with _held(out) as hold:
        return _prepare(o, files, out, given, hold)


def _prepare(
    o: Options, files: list[SourceFile], out: Path, given: Tokenizer | None, hold: Callable[[], None]
) -> Outcome:
    present = out.is_dir()
    if present:
        hold()  # before its records are read: what another prepare writes is not read half-way
    sources = fingerprint(files)
    settings = _settings(o)
    done = read_manifest(out) if present else None
    state = read_state(out) if present else None
    recorded = done or state
    if recorded is not None:
        same_corpus(out, recorded, sources, settings)
        recorded_hash = (done or {}).get("tokenizer", {}).get("hash") or (state or {}).get("tokenizer", {}).get("hash")
        if given is not None and given.hash != recorded_hash:
            raise UsageError(
                f"--tokenizer {o.tokenizer}: not the tokenizer --out {out} was prepared with ({recorded_hash}); "
                "give that one, or another --out"
            )
    if done is not None:
        for name in (STATE, SOURCES):  # a kill between the manifest and the state's removal
            (out / name).unlink(missing_ok=True)
        return Outcome(out, done, already=True)
    created = not present
    total_bytes = sum(row["bytes"] for row in sources)
    try:
        if state is None:
            tokenizer = given if given is not None else _trained(files, o, total_bytes)
            if tokenizer.eos_id is None:
                raise DataError(
                    f"tokenizer {o.tokenizer}: has no end-of-document token (<|endoftext|>, </s>, <eos>); "
                    "give one that has"
                )
            make_folder(out, "--out")
            hold()
            _save_tokenizer(tokenizer, out)
            state = {
                **marked("prepare"),
                "settings": settings,
                "sources": sources,
                "tokenizer": {"kind": tokenizer.kind, "hash": tokenizer.hash, "dir": TOKENIZER_DIR},
                "documents_read": 0,
                "source_bytes_read": 0,
                "splits": {split: SplitCount().to_json() for split in SPLITS},
            }
            _save_state(out, state, first=True)
        else:
            tokenizer = load_tokenizer(out / TOKENIZER_DIR)
            if tokenizer.hash != state["tokenizer"]["hash"]:
                raise DataError(f"{out / TOKENIZER_DIR}: not the tokenizer this prepare began with; remove --out {out}")
        return Outcome(out, _work(out, files, o, tokenizer, state, sources, settings, total_bytes), already=False)
    except DataError:
        _remove_work(out, created) if out.is_dir() else None
        raise
    except KeyboardInterrupt as stop:  # Ctrl-C, or another signal (StoppedAtOnce names it)
        what = f"stopped by {stop.signal_name}" if isinstance(stop, StoppedAtOnce) else "interrupted"
        raise Interrupted(f"{what}; run the same command again to continue into {out}") from None


def _work(
    out: Path,
    files: list[SourceFile],
    o: Options,
    tokenizer: Tokenizer,
    state: dict[str, Any],
    sources: list[dict[str, Any]],
    settings: dict[str, Any],
    total_bytes: int,
) -> dict[str, Any]:
    assert tokenizer.eos_id is not None
    dtype = dtype_for(tokenizer.vocab_size)
    counts = {split: SplitCount.from_json(state["splits"][split]) for split in SPLITS}
    writers = {split: SplitWriter(out, split, dtype, o.shard_tokens, counts[split]) for split in SPLITS}
    encoding = Encoding(tokenizer.eos_id, dtype, o.val_fraction, o.seed)
    progress = PrepareProgress(total_bytes, state["source_bytes_read"], quiet=o.quiet)
    try:
        batches = _batches(files, o, state["documents_read"])
        for result in encoded(batches, tokenizer, out / TOKENIZER_DIR, encoding, o.workers):
            for split in SPLITS:
                writers[split].write(result.ids[split], result.documents[split], result.text_bytes[split])
                writers[split].flush()
            state["documents_read"] += sum(result.documents.values())
            state["source_bytes_read"] += result.source_bytes
            state["splits"] = {split: counts[split].to_json() for split in SPLITS}
            _save_state(out, state)
            progress.advance(result.source_bytes, sum(c.tokens for c in counts.values()))
    finally:
        progress.stop()
        for writer in writers.values():
            writer.close()
    if not counts["train"].documents:
        everything = counts["val"].documents
        raise DataError(
            "the corpus holds no text: every document is empty"
            if not everything
            else f"no document went to train (of {everything}, --val-fraction {o.val_fraction}); "
            "lower --val-fraction or add documents"
        )
    splits = {split: writers[split].finish() for split in SPLITS}
    record = manifest(
        dtype=dtype,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        tokenizer={"kind": tokenizer.kind, "hash": tokenizer.hash, "dir": TOKENIZER_DIR},
        splits=splits,
        sources=sources,
        settings=settings,
    )
    write_json(out / MANIFEST, record)
    os.unlink(out / STATE)
    os.unlink(out / SOURCES)
    return record
