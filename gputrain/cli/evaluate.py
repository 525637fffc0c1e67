"""`gputrain evaluate RUN_DIR [--checkpoint ...] [--split S] [data overrides]`: a run's metrics on a split
or on new data; writes eval-<name>.json and scores-<name>.npz. Runs under torchrun too."""

from __future__ import annotations

import argparse
import sys

from gputrain.use.options import add_run_arguments, positive_int

EPILOG = """\
examples:
  gputrain evaluate runs/mlp-csv-1                         # the final weights on the test split
  gputrain evaluate runs/mlp-csv-1 --checkpoint best --split val
  gputrain evaluate runs/mlp-csv-1 data.path=new.csv       # new labelled data, the run's preprocessing
  torchrun --nproc-per-node 2 -m gputrain evaluate runs/gpt-tokens-1 data.max_eval_samples=10000

Data overrides rebuild the run's data as training did (data.max_eval_samples, data.on_error, ...);
data.path (data.val_path for token files) names new data, read whole: CSV rows with the run's columns and
classes, an image folder of the run's classes, MNIST IDX files (t10k-*), a UTF-8 text or a token file.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument(
        "--split", default="test", choices=("test", "val", "train"), help="the run's split (default test)"
    )
    parser.add_argument("--name", help="name the output files eval-NAME.json and scores-NAME.npz")
    parser.add_argument("--batch-size", type=positive_int, help="samples per forward pass (default: the run's)")
    parser.add_argument("--output-dir", metavar="DIR", help="where the files go (default: the run directory)")
    parser.add_argument("overrides", nargs="*", metavar="data.key=value", help="data overrides, e.g. data.path=new.csv")
    parser.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    from gputrain.distributed.context import shutdown_distributed
    from gputrain.use.evaluate import evaluate_run

    try:
        result = evaluate_run(
            args.run_dir,
            checkpoint=args.checkpoint,
            device=args.device,
            split=args.split,
            overrides=args.overrides,
            name=args.name,
            batch_size=args.batch_size,
            out_dir=args.output_dir,
        )
    finally:
        shutdown_distributed()
    if result.files:  # rank 0
        record = result.record
        figures = "  ".join(f"{k} {v:.4f}" for k, v in result.metrics.items())
        weights = record["weights"]
        at = f" (step {weights['step']})" if weights["step"] is not None else ""
        print(f"{result.name}: {figures}", file=sys.stdout)
        print(
            f"{record['samples']} samples, {weights['kind']} weights{at}, {record['device']}; "
            f"written: {', '.join(str(f) for f in result.files)}",
            file=sys.stderr,
        )
    return 0
