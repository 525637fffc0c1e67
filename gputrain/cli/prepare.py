"""`gputrain prepare SOURCES... --out OUT (--tokenizer PATH | --train-tokenizer N)`: a corpus into token
shards and a manifest (`data.name=tokens` reads the folder), resumable, the same bytes whatever --workers."""

from __future__ import annotations

import argparse
import os
import sys

EPILOG = """\
sources (kept in the order given; a folder's files in sorted path order, recursively):
  a text file       one document (its whole text, UTF-8; a file that is not UTF-8 is refused)
  *.jsonl           one document a line: the string in --field
  *.parquet         one document a row: the string column --column
  a saved dataset   a folder from datasets' save_to_disk (state.json, *.arrow): one document a row of --column
  a folder          its files matching --glob, each read as its suffix says
Each document's ids are followed by the tokenizer's eos id. A document goes wholly to train or val, by a
hash of its index, its text and --seed. OUT holds manifest.json, tokenizer/ and train-NNNNN.bin,
val-NNNNN.bin (uint16 ids where the vocabulary fits, else uint32). Killed, the same command continues
where it stopped and writes the same bytes; a complete OUT is left as it is.
"""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gputrain.prepare.work import DEFAULT_SHARD_TOKENS

    parser.add_argument(
        "sources", nargs="+", metavar="SOURCE", help="text/JSONL/Parquet files, folders, saved datasets"
    )
    parser.add_argument(
        "--out", required=True, metavar="OUT", help="the folder to write (new, empty, or prepare's own)"
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--tokenizer", metavar="PATH", help="a tokenizer.json, or a folder holding one")
    which.add_argument(
        "--train-tokenizer", type=_whole, metavar="N", help="train a byte-level BPE of N tokens on the corpus"
    )
    parser.add_argument("--field", default="text", help="JSONL: the field holding the text (default text)")
    parser.add_argument("--column", default="text", help="Parquet, saved datasets: the text column (default text)")
    parser.add_argument("--glob", default="*.txt", help="folders: the files to read (default *.txt)")
    parser.add_argument(
        "--val-fraction", type=float, default=0.005, help="the documents' share in val, in [0, 1) (default 0.005)"
    )
    parser.add_argument("--seed", type=_whole, default=0, help="the val split's seed (default 0)")
    parser.add_argument(
        "--workers", type=_whole, default=None, help="tokenizing processes (default: every core this process has)"
    )
    parser.add_argument(
        "--shard-tokens",
        type=_whole,
        default=DEFAULT_SHARD_TOKENS,
        help=f"tokens a shard (default {DEFAULT_SHARD_TOKENS:,})",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    from gputrain.prepare.work import Options, prepare

    outcome = prepare(
        Options(
            sources=tuple(args.sources),
            out=args.out,
            tokenizer=args.tokenizer,
            train_tokenizer=args.train_tokenizer,
            field=args.field,
            column=args.column,
            glob=args.glob,
            val_fraction=args.val_fraction,
            seed=args.seed,
            workers=_cores() if args.workers is None else args.workers,
            shard_tokens=args.shard_tokens,
            quiet=args.quiet,
        )
    )
    record = outcome.manifest
    if outcome.already:
        print(f"{outcome.out}: prepared already from the same corpus and settings; left as it is", file=sys.stderr)
        return 0
    splits = record["splits"]
    parts = [
        f"{name} {split['tokens']:,} tokens ({split['documents']:,} documents, {len(split['shards'])} shards)"
        for name, split in splits.items()
    ]
    print(f"{outcome.out}: {'; '.join(parts)}; {record['dtype']}, vocabulary {record['vocab_size']:,}")
    if record["settings"]["val_fraction"] > 0 and not splits["val"]["documents"]:
        print(
            f"note: no document went to val at --val-fraction {record['settings']['val_fraction']}; "
            "a larger fraction (or corpus) gives a val split",
            file=sys.stderr,
        )
    return 0
