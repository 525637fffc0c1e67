"""`gputrain export RUN_DIR --format F [-o OUT]`: a deployable artifact of a run's model, verified."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gputrain.use.options import add_run_arguments, non_negative_float, positive_int

FORMATS = ("safetensors", "pt2", "onnx")  # gputrain.use.artifacts.FORMATS, without importing torch here
EPILOG = """\
formats:
  safetensors  the weights (tied ones once), config.toml, spec.json and preprocess.json; verified bitwise
  pt2          a torch.export ExportedProgram (model.pt2) and its AOTInductor package (model-aoti.pt2)
  onnx         the dynamo exporter's graph (opset 18), verified with ONNX Runtime; needs the export extra:
               pip install 'gputrain[export]'
Graphs take samples as the run's data source gives them (CSV features, pixels, uint8 images, token ids),
with the run's normalisation inside, and a dynamic batch dimension (and sequence length, for a GPT).
Every export is run against the eager model on a held-out batch: export.json holds the max absolute and
relative differences; above the tolerance (0 for safetensors, 1e-4 + 1e-4 x max|eager| otherwise) the
command fails (exit 1).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, device=False)
    parser.add_argument("--format", required=True, choices=FORMATS, help="the artifact's format")
    parser.add_argument("-o", "--output", metavar="OUT", help="the folder to write (default RUN_DIR/export/FORMAT)")
    parser.add_argument(
        "--device", default="cpu", help="the device the graph is captured and verified on (default cpu: portable)"
    )
    parser.add_argument(
        "--aoti",
        default="auto",
        choices=("auto", "on", "off"),
        help="pt2: AOTInductor-compile too (auto: where it compiles here; default auto)",
    )
    parser.add_argument(
        "--atol", type=non_negative_float, help="verification's absolute tolerance (default per format)"
    )
    parser.add_argument(
        "--rtol", type=non_negative_float, help="verification's relative tolerance (default per format)"
    )
    parser.add_argument("--samples", type=positive_int, default=32, help="held-out samples to verify on (default 32)")
    parser.add_argument(
        "--verify-only", action="store_true", help="verify the artifact already in OUT again, writing nothing else"
    )
    parser.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    from gputrain.use.export import ExportOptions, default_out, export_run, verify_export

    options = ExportOptions(
        fmt=args.format,
        out=Path(args.output) if args.output else None,
        checkpoint=args.checkpoint,
        device=args.device,
        aoti=args.aoti,
        atol=args.atol,
        rtol=args.rtol,
        samples=args.samples,
    )
    if args.verify_only:
        out = options.out or default_out(Path(args.run_dir), args.format)
        record = verify_export(out, options)
    else:
        record = export_run(args.run_dir, options)
    checks = record["verification"]["checks"]
    for name, check in checks.items():
        print(
            f"{name}: verified on {record['verification']['samples']} held-out samples ({check['runtime']}): "
            f"max abs diff {check['max_abs_diff']:.3g}, max rel diff {check['max_rel_diff']:.3g} "
            f"(tolerance atol {check['atol']:g}, rtol {check['rtol']:g})"
        )
    out_dir = options.out or default_out(Path(record["run_dir"]), record["format"])
    print(f"{record['format']}: {', '.join(record['files'])} in {out_dir} (export.json)", file=sys.stderr)
    if record.get("aoti", {}).get("error"):
        print(f"pt2: no AOTInductor package ({record['aoti']['error']})", file=sys.stderr)
    return 0
