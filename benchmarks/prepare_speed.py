"""Tokens/s of `gputrain prepare` against nanoGPT's method and `datasets.map`, on the same corpus and
tokenizer, with the same number of worker processes, as ratios in one run (issue 30's proof; goal:
gputrain ≥ 1.0× each).

The corpus: Python's own standard library, its `*.py` files that are UTF-8 text (`sysconfig`'s stdlib
path; `--max-mb` caps it), in sorted path order. The tokenizer: a byte-level BPE of `--vocab` tokens
trained by `tokenizers` on the corpus's first files, with <|endoftext|>. Each method is a process of its
own, timed from its start to its exit (imports, pool start and writing included), on the same files:

- gputrain: `python -m gputrain prepare FILES --out OUT --tokenizer T --val-fraction 0 --workers N --quiet`
- nanogpt:  nanoGPT's prepare.py way: a multiprocessing Pool of N (fork) over the files, each worker
            reading its file and encoding it (`tokenizers`, one thread a worker) + eos, `imap` in
            order, the ids concatenated and written to one uint16 .bin
- datasets: nanoGPT's openwebtext way: `Dataset.from_dict(texts).map(tokenize, batched=True,
            num_proc=N)`, then the ids written to one .bin (where `datasets` is installed)

The methods run alternating, `--rounds` times; the medians' ratios are printed, and the bytes of
gputrain's train stream are checked equal to nanoGPT's .bin (the same ids, the same order). The
load average is printed with each run: the machine may be shared.

    python benchmarks/prepare_speed.py [--workers N] [--rounds 3] [--max-mb 40] [--vocab 8192]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NANOGPT = r"""
import os, sys, numpy as np
from multiprocessing import Pool
from tokenizers import Tokenizer
tok_path, out, workers, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def init():
    global enc, eos
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    enc = Tokenizer.from_file(tok_path)
    eos = enc.token_to_id("<|endoftext|>")
def process(path):
    with open(path, encoding="utf-8", newline="") as f:  # the text as it is (\r\n kept), as prepare reads it
        ids = enc.encode(f.read(), add_special_tokens=False).ids
    ids.append(eos)
    return np.array(ids, dtype=np.uint16)
if __name__ == "__main__":
    with Pool(workers, initializer=init) as pool:
        arrays = list(pool.imap(process, files, chunksize=16))
    np.concatenate(arrays).tofile(out)
"""

DATASETS = r"""
import os, sys, numpy as np
from datasets import Dataset, disable_progress_bars
from tokenizers import Tokenizer
disable_progress_bars()
tok_path, out, workers, cache, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5:]
os.environ["TOKENIZERS_PARALLELISM"] = "false"
enc = None
def tokenize(batch):
    global enc
    if enc is None:
        enc = Tokenizer.from_file(tok_path)
    eos = enc.token_to_id("<|endoftext|>")
    ids = [e.ids + [eos] for e in enc.encode_batch(batch["text"], add_special_tokens=False)]
    return {"ids": ids, "len": [len(i) for i in ids]}
if __name__ == "__main__":
    texts = [open(p, encoding="utf-8", newline="").read() for p in files]
    data = Dataset.from_dict({"text": texts})
    data = data.map(tokenize, batched=True, num_proc=workers, remove_columns=["text"],
                    cache_file_name=os.path.join(cache, "map.arrow"))
    total = int(np.sum(data["len"], dtype=np.uint64))
    arr = np.memmap(out, dtype=np.uint16, mode="w+", shape=(total,))
    start = 0
    for batch in data.with_format("numpy").iter(batch_size=1024):
        flat = np.concatenate(batch["ids"])
        arr[start:start + len(flat)] = flat
        start += len(flat)
    arr.flush()
"""


def corpus(max_bytes: int) -> list[str]:
    """The stdlib's UTF-8 `*.py` files, sorted, up to `max_bytes`."""
    files, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            data = path.read_bytes()
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not data.strip() or b"\0" in data or not path.is_file():
            continue
        files.append(str(path))
        total += len(data)
        if total >= max_bytes:
            break
    return files


def train_tokenizer(files: list[str], vocab: int, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((Path(f).read_text(encoding="utf-8") for f in files[:300]), trainer=trainer)
    tok.save(str(path))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str]) -> tuple[float, float]:
    """The command's wall time and the CPU time of it and its workers (the less a shared machine's
    load moves it: the work each method does)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command[:6])} ...\n{done.stderr[-2000:]}")
    return wall, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-mb", type=float, default=40.0)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    files = corpus(int(args.max_mb * 2**20))
    size = sum(os.path.getsize(f) for f in files)
    try:
        import datasets  # noqa: F401

        methods = ["gputrain", "nanogpt", "datasets"]
    except ImportError:
        methods = ["gputrain", "nanogpt"]
    print(
        f"corpus: {len(files)} stdlib .py files, {size / 2**20:.1f} MiB; workers {args.workers}; {os.cpu_count()} cores"
    )
    times: dict[str, list[float]] = {m: [] for m in methods}
    cpus: dict[str, list[float]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tok = tmp / "tokenizer.json"
        train_tokenizer(files, args.vocab, tok)
        tokens = 0
        for r in range(args.rounds):
            order = methods[r % len(methods) :] + methods[: r % len(methods)]  # alternating: none always first
            for method in order:
                work = tmp / f"{method}-{r}"
                work.mkdir()
                if method == "gputrain":
                    command = [sys.executable, "-m", "gputrain", "prepare", *files, "--out", str(work / "out")]
                    command += [
                        "--tokenizer",
                        str(tok),
                        "--val-fraction",
                        "0",
                        "--workers",
                        str(args.workers),
                        "--quiet",
                    ]
                elif method == "nanogpt":
                    command = [
                        sys.executable,
                        "-c",
                        NANOGPT,
                        str(tok),
                        str(work / "all.bin"),
                        str(args.workers),
                        *files,
                    ]
                else:
                    command = [sys.executable, "-c", DATASETS, str(tok), str(work / "all.bin"), str(args.workers)]
                    command += [str(work), *files]
                load = os.getloadavg()[0]
                wall, cpu = timed(command)
                times[method].append(wall)
                cpus[method].append(cpu)
                print(
                    f"round {r + 1} {method:9s} {wall:7.2f} s wall {cpu:7.2f} s CPU  "
                    f"(load {load:.1f} -> {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            ours = tmp / f"gputrain-{r}" / "out"
            record = json.loads((ours / "manifest.json").read_text())
            stream = b"".join((ours / s["file"]).read_bytes() for s in record["splits"]["train"]["shards"])
            reference = (tmp / f"nanogpt-{r}" / "all.bin").read_bytes()
            assert stream == reference, "gputrain's ids differ from nanoGPT's method's"
            if "datasets" in methods:
                assert (tmp / f"datasets-{r}" / "all.bin").read_bytes() == reference, "datasets.map's ids differ"
            tokens = record["splits"]["train"]["tokens"]
    medians = {m: statistics.median(t) for m, t in times.items()}
    cpu_medians = {m: statistics.median(t) for m, t in cpus.items()}
    print(f"tokens: {tokens:,} (the same ids from every method)")
    for m, t in medians.items():
        print(f"{m:9s} median {t:6.2f} s  {tokens / t:12,.0f} tokens/s  {tokens / cpu_medians[m]:12,.0f} tokens/CPU-s")
    for m in methods[1:]:
        print(
            f"gputrain / {m}: {medians[m] / medians['gputrain']:.2f}x tokens/s (goal >= 1.0), "
            f"{cpu_medians[m] / cpu_medians['gputrain']:.2f}x tokens per CPU-second"
        )


if __name__ == "__main__":
    main()
