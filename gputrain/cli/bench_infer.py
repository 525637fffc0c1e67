"""`gputrain bench-infer RUN_DIR [--batch 1,32]`: inference latency and throughput of a run's model in
eager PyTorch, torch.compile, the exported program and ONNX Runtime, on the CPU and on CUDA where present."""

from __future__ import annotations

import argparse
import json
import sys

from gputrain.use import bounds
from gputrain.use.bounds import argparse_type
from gputrain.use.options import add_run_arguments, positive_int

EPILOG = """\
Latency: p50 and p99 of single calls at the smallest --batch; throughput: samples/s at the largest.
Speed-ups are against eager PyTorch on the same device. A language model also reports its generation
rate with and without the KV cache. The figures go to RUN_DIR/bench-infer.json.
modes: eager, compile, export, aoti (AOTInductor; compiling takes tens of seconds on a CPU), onnxruntime
(needs the export extra: pip install 'gputrain[export]'; skipped with that note when missing).
"""


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, device=False)
    parser.add_argument(
        "--batch",
        type=argparse_type(bounds.bench_batches),
        default=(1, 32),
        help=f"batch sizes, e.g. 1,32 (default); at most {bounds.MAX_BENCH_SIZES}, each 1..{bounds.MAX_BENCH_BATCH:,}",
    )
    parser.add_argument(
        "--modes", type=_names, default=None, help="comma-separated (default eager,compile,export,onnxruntime)"
    )
    parser.add_argument(
        "--device",
        type=_names,
        default=(),
        help="cpu, cuda, cuda:N, or several: cpu,cuda (default: cpu, and cuda if present)",
    )
    parser.add_argument(
        "--repeats",
        type=argparse_type(bounds.bench_repeats),
        default=100,
        help=f"timed calls per batch size, 1..{bounds.MAX_BENCH_REPEATS:,} (default 100)",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        help="CPU threads for PyTorch and ONNX Runtime alike (default: each its own; 1 gives steady figures on a "
        "machine other work shares)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    import torch

    from gputrain.run.files import write_json
    from gputrain.run.layout import BENCH_INFER
    from gputrain.run.output import Owner, check_output_file, json_record, marked
    from gputrain.use.bench import (
        DEFAULT_MODES,
        BenchOptions,
        bench_devices,
        bench_inference,
        check_modes,
        generation_rates,
    )
    from gputrain.use.loaded import load_run

    modes = args.modes or DEFAULT_MODES
    check_modes(modes, asked=args.modes is not None)
    devices = bench_devices(args.device)  # before the run is loaded: a device that is not here, in one line
    if args.threads is not None:  # the generation rates too, not only the table (bench_inference sets its own)
        torch.set_num_threads(args.threads)
    loaded = load_run(args.run_dir, checkpoint=args.checkpoint, device="cpu")
    figures = check_output_file(  # before the timing: the run's own file, no link out, one bench-infer wrote
        loaded.run_dir / BENCH_INFER,
        "RUN_DIR",
        Owner.of(runs=[loaded.run_dir], designated=[BENCH_INFER]),
        json_record("bench-infer", "run_dir", "model", "results"),
    )
    assert figures is not None
    options = BenchOptions(batches=args.batch, modes=modes, devices=devices, repeats=args.repeats, threads=args.threads)
    results = bench_inference(loaded, options)
    rates = generation_rates(loaded, options.devices)
    record = {
        "run_dir": str(loaded.run_dir),
        "model": loaded.config.model.name,
        "data": loaded.config.data.name,
        "torch": str(torch.__version__),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "results": [asdict(r) for r in results],
        "generation": [asdict(r) for r in rates],
        **marked("bench-infer"),
    }
    write_json(figures, record)
    if args.json:
        json.dump(record, sys.stdout, indent=2)
        print()
        return 0
    from gputrain.use.bench import results_table

    header, rows = results_table(results)
    print(_render(header, rows, args.markdown))
    for rate in rates:
        cache = "with" if rate.cache else "without"
        print(f"generate on {rate.device}, {cache} the KV cache: {rate.tokens_per_s:,.0f} tokens/s")
    print(
        f"{loaded.config.model.name} on {loaded.config.data.name}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} CPU threads; figures in {figures}",
        file=sys.stderr,
    )
    return 0


def _render(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
        return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows])
