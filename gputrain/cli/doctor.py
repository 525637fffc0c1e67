"""`gputrain doctor`: what can this machine train on? Its GPUs, or why not and how to fix it.

Exit code 0 when no check failed: a machine without a GPU passes (gputrain trains on its CPU), a
GPU that torch cannot use fails. With --require-gpu, no usable GPU is a failure too (exit 1).
"""

from __future__ import annotations

import argparse

from gputrain.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help='print {"facts": {...}, "checks": [...]} instead of the table'
    )
    parser.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail (exit 1) unless torch can train on a GPU here; without it, a machine with no GPU passes",
    )
    parser.add_argument(
        "--dist",
        action="store_true",
        help="also run an all-reduce smoke test: NCCL across the visible GPUs, or gloo across two CPU processes",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds the --dist smoke test may take before its ranks are killed (default 60)",
    )


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    # Heavy imports after parsing, so `--help` and usage errors stay instant.
    from gputrain.env.checks import passed, run_checks
    from gputrain.env.dist_smoke import choose_backend, collect_dist_smoke
    from gputrain.env.facts import collect_env
    from gputrain.env.render import render_json, render_table

    facts = collect_env()
    if args.dist:
        backend, world_size = choose_backend(facts.device_count, facts.nccl_version is not None)
        facts.dist = collect_dist_smoke(backend, world_size, timeout_s=args.timeout)
    checks = run_checks(facts, require_gpu=args.require_gpu)
    print(render_json(facts, checks) if args.json else render_table(checks))
    return 0 if passed(checks) else 1
