"""`gputrain bench`: what this machine can do, measured: matmul FLOP/s per dtype, conv2d,
memory and host↔device bandwidth, all-reduce bus bandwidth (under torchrun).

Results are cached per machine so training reports MFU against the measured peak.
"""

from __future__ import annotations

import argparse
import json
import os

from gputrain.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help='print {"device": ..., "results": [...]} instead of the table'
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller sizes and fewer repeats (under 30 s on a 2-core CPU)"
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="what to measure (default auto: the GPU if there is one)",
    )
    parser.add_argument("--no-cache", action="store_true", help="do not record the results in the per-machine cache")


def run(args: argparse.Namespace) -> int:
    import torch

    from gputrain.bench.cache import busy_machine, save_results
    from gputrain.bench.dist_run import run_allreduce_benchmark
    from gputrain.bench.render import render_table
    from gputrain.bench.runner import one_thread_matmuls, run_benchmarks

    if args.device == "cuda" and not torch.cuda.is_available():
        from gputrain.env import explain_cuda_unavailable

        raise UsageError(f"--device cuda: CUDA is not available: {explain_cuda_unavailable()}")
    device_type = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        report = run_allreduce_benchmark(device_type, quick=args.quick)
        if report is None:  # not rank 0: rank 0 speaks for all
            return 0
    else:
        # The first GPU: the one `train.device=auto` picks, and the name the cache files it under.
        device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
        # other processes on the cores make a CPU's figures low (a GPU's matmuls do not share them)
        suspect = busy_machine() if device.type == "cpu" else None
        report = run_benchmarks(device, quick=args.quick)
        if suspect:
            report.notes.append(f"{suspect}: these figures may be low; run `gputrain bench` again on an idle machine")
        if not args.no_cache:
            results = [r.to_dict() for r in report.results]
            path = save_results(report.device["name"], report.device["mode"], results, suspect=suspect)
            report.notes.append(f"cached in {path}")
            if device.type == "cpu" and torch.get_num_threads() > 1:
                # a run on a busy machine trains with 1 thread: its peak is measured too
                name, single = one_thread_matmuls(args.quick)
                save_results(name, report.device["mode"], [r.to_dict() for r in single], suspect=suspect)
                report.notes.append(
                    "matmul with 1 thread (a run on a busy machine uses 1): "
                    + ", ".join(f"{r.dtype} {r.value / 1e9:.1f} GFLOP/s" for r in single)
                )
            if report.device["mode"] != "full":
                report.notes.append(
                    f"{report.device['mode']} mode: its smaller matrices do not reach the peak, so its "
                    "figures are not used as the MFU peak (a full `gputrain bench` sets that)"
                )
    print(json.dumps(report.to_dict(), indent=2) if args.json else render_table(report))
    return 0
