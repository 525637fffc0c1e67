"""Documents into token ids, in a pool of worker processes, in order.

A batch is a run of consecutive documents and the index of its first one. A worker encodes the
batch's texts (`Tokenizer.encode_batch`, one thread each: the pool is the parallelism), puts the eos
id after each document, sends each document to train or val (`draws`: a hash of the seed, the
document's index and its text, so the split does not depend on how the documents are batched or how
many workers there are) and returns each split's ids as raw bytes of the shard dtype. The results
come back in batch order, at most `2 × workers` batches in flight, so memory stays bounded whatever
the corpus's size.
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gputrain.errors import RunError
from gputrain.text.tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True, slots=True)
class Encoding:
    """What a worker needs besides the documents."""

    eos_id: int
    dtype: str
    val_fraction: float
    seed: int


@dataclass(frozen=True, slots=True)
class Encoded:
    """A batch's result: per split, the ids (raw bytes), the documents and their UTF-8 bytes."""

    ids: dict[str, bytes]
    documents: dict[str, int]
    text_bytes: dict[str, int]
    source_bytes: int
    """The source bytes the batch's documents took (for the progress bar)."""


def draws(index: int, data: bytes, seed: int) -> tuple[float, float]:
    """Two uniform numbers in [0, 1) of a document: the first puts it in val (below val_fraction), the
    second in the sample a tokenizer is trained on. The same for the same seed, index and text."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{seed}\0{index}\0".encode())
    h.update(data)
    digest = h.digest()
    return int.from_bytes(digest[:8], "little") / 2**64, int.from_bytes(digest[8:], "little") / 2**64


def encode(tokenizer: Tokenizer, encoding: Encoding, first: int, texts: list[str], source_bytes: int) -> Encoded:
    """One batch of documents (`first` the index of its first), in the worker or in-process."""
    dtype = np.dtype(encoding.dtype).newbyteorder("<")
    eos = np.array([encoding.eos_id], dtype=dtype)
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": []}
    documents = {"train": 0, "val": 0}
    text_bytes = {"train": 0, "val": 0}
    for offset, (text, ids) in enumerate(zip(texts, tokenizer.encode_batch(texts), strict=True)):
        data = text.encode("utf-8")
        split = "val" if draws(first + offset, data, encoding.seed)[0] < encoding.val_fraction else "train"
        parts[split].append(np.asarray(ids, dtype=dtype))
        parts[split].append(eos)
        documents[split] += 1
        text_bytes[split] += len(data)
    ids_bytes = {split: np.concatenate(arrays).tobytes() if arrays else b"" for split, arrays in parts.items()}
    return Encoded(ids_bytes, documents, text_bytes, source_bytes)


_worker: tuple[Tokenizer, Encoding] | None = None
PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal a process gets when its parent ends."""


def _die_with(parent: int) -> None:
    """End this worker when the prepare that started it ends, however it ends (kill -9 too): else it
    would wait on its queue for ever, holding the terminal's pipes. Linux's parent-death signal;
    elsewhere a thread that watches the parent."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        set_parent_death_signal = libc.prctl if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):
        set_parent_death_signal = None
    if set_parent_death_signal is not None:
        set_parent_death_signal(PR_SET_PDEATHSIG, signal.SIGKILL)
    else:

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # it ended before the signal was set
        os._exit(1)


def _init(tokenizer_dir: str, encoding: Encoding, parent: int, ready: Any) -> None:
    global _worker
    _die_with(parent)
    ready.release()  # the parent goes on once every worker would die with it
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread a worker: the pool is the parallelism
    _worker = (load_tokenizer(tokenizer_dir), encoding)


def _encode_in_worker(first: int, texts: list[str], source_bytes: int) -> Encoded:
    assert _worker is not None
    return encode(_worker[0], _worker[1], first, texts, source_bytes)


Batch = tuple[int, list[str], int]
"""(index of the first document, the documents' texts, the source bytes they took)"""


def _can_fork() -> bool:
    """Fork the workers (they start at once) where this process runs no other Python thread."""
    return "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1


_START_S = 120.0
"""How long the workers may take to start (a spawned one imports the tokenizers library)."""


def _pool(workers: int, tokenizer_dir: Path, encoding: Encoding) -> ProcessPoolExecutor:
    """`workers` processes with the tokenizer loaded. Forked where this process runs no other Python
    thread (Linux: a worker starts at once, as nanoGPT's do), else spawned (nothing of this process's
    threads or locks inherited). The tokenizers library's own threads (a BPE trained here starts
    them) it disables itself in a forked child; TOKENIZERS_PARALLELISM=false, set before the workers
    start, keeps each to one thread without its warning. An executor,
    not a `multiprocessing.Pool`: a worker that dies (the kernel's OOM killer) breaks it, where a Pool
    would wait for ever."""
    context = multiprocessing.get_context("fork" if _can_fork() else "spawn")
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        ready = context.Semaphore(0)
        initargs = (str(tokenizer_dir), encoding, os.getpid(), ready)
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_init, initargs=initargs)
        for _ in range(workers):  # started now, while the variable holds (the executor starts them lazily)
            pool.submit(int)
        # nothing is written until every worker would end with this process: a spawned worker killed
        # orphaned in its start-up (before its parent-death signal) would wait for ever, holding the pipes
        for _ in range(workers):
            if not ready.acquire(timeout=_START_S):
                pool.shutdown(wait=False, cancel_futures=True)
                raise RunError(f"prepare's {workers} workers did not start within {_START_S:.0f} s")
        return pool
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def encoded(
    batches: Iterable[Batch], tokenizer: Tokenizer, tokenizer_dir: Path, encoding: Encoding, workers: int
) -> Iterator[Encoded]:
    """Each batch encoded, in order: in this process for one worker, else in a pool of `workers`
    processes (`_pool`).

    Raises:
        RunError: a worker died; what was written before stays, to continue from.
    """
    if workers == 1:
        previous = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            for first, texts, source_bytes in batches:
                yield encode(tokenizer, encoding, first, texts, source_bytes)
        finally:
            if previous is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = previous
        return
    pool = _pool(workers, tokenizer_dir, encoding)
    try:
        pending: collections.deque[Future[Encoded]] = collections.deque()
        for batch in batches:
            pending.append(pool.submit(_encode_in_worker, *batch))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BrokenProcessPool:
        raise RunError(
            "a tokenizing worker process died (killed, or out of memory: fewer --workers need less); "
            "run the same command again to continue"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
