"""`gputrain predict RUN_DIR INPUT [-o OUT]`: the run's model on new CSV rows, images or arrays, as CSV."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from gputrain.use.options import add_run_arguments, positive_int

EPILOG = """\
INPUT is one of:
  a CSV file (runs trained on CSV data): the feature columns by name, in any order; the label column may be
    left out. Out: every class's probability p_<class> and the predicted class, or the predicted value.
  an image file or a folder of images (runs trained on images): resized as in training. Out: the top-k classes.
  a .npy array [N, *input shape] of samples as the data source gives them (any run but a language model).
The run's preprocessing (column order, normalisation, image size, class names) is applied.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument("input", metavar="INPUT", help="a CSV file, an image file or folder, or a .npy array")
    parser.add_argument(
        "-o",
        "--output",
        metavar="OUT.csv",
        help="write the predictions here (default, or -: stdout); never over a file predict did not write",
    )
    parser.add_argument(
        "--top-k", type=positive_int, metavar="K", help="list the K most probable classes (default: 5 for images)"
    )
    parser.add_argument("--batch-size", type=positive_int, default=256, help="inputs per forward pass (default 256)")
    parser.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    from gputrain.run.output import Owner, atomic, check_output_file, make_folder
    from gputrain.use.loaded import load_run
    from gputrain.use.predict import prediction_rows, written_by_predict

    loaded = load_run(args.run_dir, checkpoint=args.checkpoint, device=args.device)
    out = None
    if args.output is not None:  # before any row is computed for a place that cannot take it
        data = loaded.config.data
        owner = Owner.of(runs=[loaded.run_dir], inputs=[args.input, loaded.weights.path, data.path, data.val_path])
        out = check_output_file(args.output, "-o", owner, written_by_predict, stdout=True, example="predictions.csv")
    if loaded.weights.note:
        print(loaded.weights.note, file=sys.stderr)
    rows = prediction_rows(loaded, Path(args.input), top_k=args.top_k, batch_size=args.batch_size)
    if out is None:
        csv.writer(sys.stdout, lineterminator="\n").writerows(rows)
        return 0
    make_folder(out.parent, "-o")
    with atomic(out) as tmp, tmp.open("w", newline="") as f:  # never half a file where OUT was asked for
        writer = csv.writer(f, lineterminator="\n")
        count = -1
        for row in rows:
            writer.writerow(row)
            count += 1
    print(f"{count} predictions written to {out}", file=sys.stderr)
    return 0
