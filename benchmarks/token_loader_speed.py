"""Tokens per second one rank's training feed delivers from a prepared folder's shards.

It writes a prepared folder (manifest.json and uint16 shards of random ids of a 50,257-token
vocabulary, as `gputrain prepare` would for GPT-2's tokenizer) into a temporary folder, builds
`data.name=tokens` on it, and times whole epochs of the real feed (data/feed.py's `BatchFeed`, the
`BatchPlan` order shuffled over the whole corpus, the DataLoader gputrain builds) on rank 0 of
`--ranks` ranks: the windows it reads and hands over as int64 (x, y) micro-batches, per second.
Two read paths: the micro-batch gathered in one pass over the memory maps (`TokenWindows.__getitems__`,
what the feed uses) and, for comparison, window by window (`__getitem__` per sample, then collated).
The goal (issue 30): at least 20× what one H100 trains on GPT-2 124M (≈ 500K tokens/s), 10M tokens/s.
It also times the start-up scan of the shards for ids beyond the vocabulary (GB/s).

    python benchmarks/token_loader_speed.py [--tokens 64000000] [--shards 4] [--seq-len 1024]
        [--micro-batch 16] [--ranks 1] [--workers 0,auto] [--repeats 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB = 50257


def write_prepared(folder: Path, tokens: int, shards: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    per = -(-tokens // shards)
    listed = []
    for k in range(shards):
        ids = rng.integers(0, VOCAB, min(per, tokens - k * per), dtype=np.uint16)
        ids.tofile(folder / f"train-{k:05d}.bin")
        listed.append({"file": f"train-{k:05d}.bin", "tokens": len(ids), "sha256": hashlib.sha256(ids).hexdigest()})
    val = rng.integers(0, VOCAB, 1 << 16, dtype=np.uint16)
    val.tofile(folder / "val-00000.bin")
    manifest = {
        "format": "gputrain-tokens",
        "version": 1,
        "dtype": "uint16",
        "vocab_size": VOCAB,
        "eos_id": VOCAB - 1,
        "tokenizer": {"kind": "hf", "hash": "sha256:" + "0" * 64, "dir": "tokenizer"},
        "splits": {
            "train": {"tokens": tokens, "documents": 1, "bytes": 0, "shards": listed},
            "val": {
                "tokens": len(val),
                "documents": 1,
                "bytes": 0,
                "shards": [{"file": "val-00000.bin", "tokens": len(val), "sha256": ""}],
            },
        },
        "sources": [],
        "settings": {},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=1))


class PerSample(torch.utils.data.Dataset):
    """The same windows without the batched read: the DataLoader then reads sample by sample."""

    def __init__(self, windows: torch.utils.data.Dataset) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)  # type: ignore[arg-type]

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        return self.windows[index]


def feed_rate(train, args, workers: str, max_steps: int) -> float:  # type: ignore[no-untyped-def]
    from gputrain.data.batches import BatchPlan
    from gputrain.data.feed import BatchFeed

    plan = BatchPlan(len(train), args.micro_batch * args.ranks, 1, dp_rank=0, dp_size=args.ranks, seed=0)
    feed = BatchFeed(train, plan, torch.device(args.device), num_workers=workers)
    try:
        best = 0.0
        for epoch in range(args.repeats + 1):  # the first pass starts any workers and warms the maps: dropped
            tokens, start = 0, time.perf_counter()
            for steps, group in enumerate(feed.epoch(epoch), 1):
                tokens += sum(int(x.numel()) for x, _ in group)
                if steps >= max_steps:
                    break
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            rate = tokens / (time.perf_counter() - start)
            if epoch:
                best = max(best, rate)
        return best
    finally:
        feed.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=1, help="world size the plan divides the global batch over")
    parser.add_argument("--workers", default="0,auto")
    parser.add_argument("--steps", type=int, default=400, help="steps timed per pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="where the feed puts the batches (cuda: pinned, prefetched)")
    args = parser.parse_args()
    from gputrain.config import load_config
    from gputrain.data import build_data
    from gputrain.data import tokens as token_data

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(
        f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, {gpu}; torch {torch.__version__}; "
        f"feed to {args.device}, micro-batch {args.micro_batch} x {args.seq_len} tokens, {args.ranks} ranks"
    )
    with tempfile.TemporaryDirectory() as tmp:
        write_prepared(Path(tmp), args.tokens, args.shards)
        config = load_config({"data.name": "tokens", "data.path": tmp, "data.seq_len": args.seq_len})
        start = time.perf_counter()
        train = build_data(config.data, seed=0).train
        scan = time.perf_counter() - start
        print(
            f"build (manifest, sizes, scan of {args.tokens * 2 / 1e9:.2f} GB for ids >= vocab): {scan:.2f} s "
            f"= {args.tokens * 2 / 1e9 / scan:.2f} GB/s"
        )
        token_data._scanned.clear()
        for workers in args.workers.split(","):
            for name, data in (("batched", train), ("per sample", PerSample(train))):
                rate = feed_rate(data, args, workers, args.steps)
                goal = "meets" if rate >= 10e6 else "misses"
                print(
                    f"workers={workers:>4} {name:>10}: {rate / 1e6:7.1f} M tokens/s per rank "
                    f"({rate / 500e3:5.1f}x one H100's GPT-2 124M; {goal} the 10M goal)"
                )


if __name__ == "__main__":
    main()
